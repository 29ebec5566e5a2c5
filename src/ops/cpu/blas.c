/*
 * blas.c - loads OpenBLAS with the widest kernel the CPU's features allow,
 * and says which GEMM kernels the cpu backend runs (contract in blas.h).
 *
 * Why dlopen: OpenBLAS chooses its core in a constructor when it is loaded,
 * from the CPU model, reading only OPENBLAS_CORETYPE; there is no call to
 * change it afterwards. So the library is not linked: a constructor here
 * loads it (single-threaded, before main, where setting the environment is
 * safe), asks which core it took, and if that core is narrower than the
 * CPU's features allow, unloads it and loads it again with
 * OPENBLAS_CORETYPE naming the right core. OPENBLAS_NUM_THREADS=1 is set
 * for the load as well, so OpenBLAS starts no threads of its own. The
 * user's values of both variables are restored afterwards (child
 * processes see them unchanged).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ops/cpu/blas.h"
#include "ops/cpu/dnnl.h"

/* cblas.h values; declared here since the library is not linked. */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha,
                               const float *A, int lda, const float *B, int ldb, float beta,
                               float *C, int ldc);

static struct {
    void *handle;
    cblas_sgemm_fn sgemm;
    fsdp_status status;
    bool openblas_only;      /* FSDP_CPU_GEMM pins OpenBLAS for every dtype */
    bool bf16_dot;           /* oneDNN runs bf16 GEMMs (set by dnnl_once) */
    bool f32_dnnl;           /* oneDNN runs fsdp_cpu_gemm's fp32 GEMMs (dnnl_once) */
    char err[512];
    char core[32];           /* the OpenBLAS core in use */
    char openblas[256];      /* "OpenBLAS 0.3.21 Cooperlake kernel (...)" */
    char desc[640];          /* "fp32: ...; bf16: ..." (dnnl_once) */
    char warn[512];
} g_blas;

static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;

/* ---- which core for which CPU ----------------------------------------- */

static const struct {
    const char *name;
    fsdp_cpu_gemm_isa isa;
} openblas_cores[] = {
    /* x86-64 cores of OpenBLAS 0.3.x (dynamic.c), by their sgemm kernel */
    {"SapphireRapids", FSDP_CPU_GEMM_ISA_AVX512_BF16},
    {"Cooperlake", FSDP_CPU_GEMM_ISA_AVX512_BF16},
    {"SkylakeX", FSDP_CPU_GEMM_ISA_AVX512},
    {"Haswell", FSDP_CPU_GEMM_ISA_AVX2},
    {"Zen", FSDP_CPU_GEMM_ISA_AVX2},
    {"Excavator", FSDP_CPU_GEMM_ISA_AVX2},
    {"Sandybridge", FSDP_CPU_GEMM_ISA_AVX},
    {"Bulldozer", FSDP_CPU_GEMM_ISA_AVX},
    {"Piledriver", FSDP_CPU_GEMM_ISA_AVX},
    {"Steamroller", FSDP_CPU_GEMM_ISA_AVX},
    {"Prescott", FSDP_CPU_GEMM_ISA_SSE},
    {"Core2", FSDP_CPU_GEMM_ISA_SSE},
    {"Penryn", FSDP_CPU_GEMM_ISA_SSE},
    {"Dunnington", FSDP_CPU_GEMM_ISA_SSE},
    {"Nehalem", FSDP_CPU_GEMM_ISA_SSE},
    {"Atom", FSDP_CPU_GEMM_ISA_SSE},
    {"Nano", FSDP_CPU_GEMM_ISA_SSE},
    {"Opteron", FSDP_CPU_GEMM_ISA_SSE},
    {"Opteron_SSE3", FSDP_CPU_GEMM_ISA_SSE},
    {"Barcelona", FSDP_CPU_GEMM_ISA_SSE},
    {"Bobcat", FSDP_CPU_GEMM_ISA_SSE},
    {"Athlon", FSDP_CPU_GEMM_ISA_SSE},
    {"Katmai", FSDP_CPU_GEMM_ISA_SSE},
    {"Coppermine", FSDP_CPU_GEMM_ISA_SSE},
    {"Northwood", FSDP_CPU_GEMM_ISA_SSE},
    {"Banias", FSDP_CPU_GEMM_ISA_SSE},
    {"Unknown", FSDP_CPU_GEMM_ISA_SSE},
};

/* The core to ask for at each level (index: fsdp_cpu_gemm_isa). SSE: none,
 * OpenBLAS's own pick among the SSE cores is as good as any. */
static const char *const core_for_isa[] = {NULL, "Sandybridge", "Haswell", "SkylakeX",
                                           "Cooperlake"};

static const char *const isa_names[] = {"SSE", "AVX", "AVX2", "AVX-512", "AVX-512 BF16"};

fsdp_cpu_gemm_isa fsdp_cpu_gemm_isa_of_cpu(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init(); /* may run in a constructor, before libgcc's */
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
    if (avx512 && __builtin_cpu_supports("avx512bf16"))
        return FSDP_CPU_GEMM_ISA_AVX512_BF16;
    if (avx512)
        return FSDP_CPU_GEMM_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return FSDP_CPU_GEMM_ISA_AVX2;
    if (__builtin_cpu_supports("avx"))
        return FSDP_CPU_GEMM_ISA_AVX;
#endif
    return FSDP_CPU_GEMM_ISA_SSE;
}

fsdp_cpu_gemm_isa fsdp_cpu_openblas_core_isa(const char *core)
{
    for (size_t i = 0; core && i < sizeof openblas_cores / sizeof openblas_cores[0]; i++)
        if (!strcasecmp(core, openblas_cores[i].name))
            return openblas_cores[i].isa;
    return FSDP_CPU_GEMM_ISA_UNKNOWN;
}

const char *fsdp_cpu_openblas_override(const char *picked, fsdp_cpu_gemm_isa cpu)
{
    fsdp_cpu_gemm_isa have = fsdp_cpu_openblas_core_isa(picked);
    if (have == FSDP_CPU_GEMM_ISA_UNKNOWN || cpu <= FSDP_CPU_GEMM_ISA_SSE || have >= cpu)
        return NULL;
    return core_for_isa[cpu];
}

static const char *isa_name(fsdp_cpu_gemm_isa isa)
{
    return isa >= 0 ? isa_names[isa] : "?";
}

/* ---- loading ----------------------------------------------------------- */

/* Set (value != NULL) or unset an environment variable. */
static void env_put(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* Load OpenBLAS with OPENBLAS_CORETYPE = core (NULL: the user's setting,
 * or OpenBLAS's own detection); its core name in *name. False with
 * g_blas.err set on failure. */
static bool openblas_load(const char *core, const char **name)
{
    if (core)
        setenv("OPENBLAS_CORETYPE", core, 1);
    static const char *const sonames[] = {"libopenblas.so.0", "libopenblas.so"};
    const char *why = "";
    for (size_t i = 0; i < 2 && !g_blas.handle; i++) {
        g_blas.handle = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (!g_blas.handle)
            why = dlerror();
    }
    if (!g_blas.handle) {
        snprintf(g_blas.err, sizeof g_blas.err,
                 "cpu backend: cannot load OpenBLAS (%s); install it with tools/install-deps.sh "
                 "(Debian: apt-get install libopenblas0)", why ? why : "not found");
        return false;
    }
    g_blas.sgemm = (cblas_sgemm_fn)dlsym(g_blas.handle, "cblas_sgemm");
    char *(*corename)(void) = (char *(*)(void))dlsym(g_blas.handle, "openblas_get_corename");
    void (*set_threads)(int) = (void (*)(int))dlsym(g_blas.handle, "openblas_set_num_threads");
    if (!g_blas.sgemm || !corename || !set_threads) {
        snprintf(g_blas.err, sizeof g_blas.err,
                 "cpu backend: the library loaded as OpenBLAS lacks cblas_sgemm, "
                 "openblas_get_corename or openblas_set_num_threads; reinstall libopenblas0");
        dlclose(g_blas.handle);
        g_blas.handle = NULL;
        return false;
    }
    set_threads(1);
    *name = corename();
    return true;
}

static const char *openblas_version(void)
{
    char *(*config)(void) = (char *(*)(void))dlsym(g_blas.handle, "openblas_get_config");
    static char ver[32];
    const char *c = config ? config() : NULL; /* "OpenBLAS 0.3.21 DYNAMIC_ARCH ..." */
    if (c && sscanf(c, "OpenBLAS %31s", ver) == 1)
        return ver;
    return "?";
}

/* Parse FSDP_CPU_GEMM into (openblas_only, pinned core or NULL). False
 * with g_blas.err set if the value is not one of the documented forms. */
static bool parse_pin(const char *v, bool *openblas_only, const char **core)
{
    *openblas_only = false;
    *core = NULL;
    if (!v || !*v || !strcasecmp(v, "auto"))
        return true;
    if (!strncasecmp(v, "openblas", 8) && (v[8] == '\0' || v[8] == ':')) {
        *openblas_only = true;
        if (v[8] == ':' && v[9])
            *core = v + 9;
        return true;
    }
    snprintf(g_blas.err, sizeof g_blas.err,
             "FSDP_CPU_GEMM='%s' is not auto, openblas or openblas:CORE (an OpenBLAS core name "
             "such as Haswell); unset it or fix it", v);
    return false;
}

static void blas_load(void)
{
    g_blas.status = FSDP_STATUS_INTERNAL;
    bool openblas_only;
    const char *pin;
    if (!parse_pin(getenv("FSDP_CPU_GEMM"), &openblas_only, &pin)) {
        g_blas.status = FSDP_STATUS_INVALID_ARG;
        return;
    }
    char *user_core = getenv("OPENBLAS_CORETYPE") ? strdup(getenv("OPENBLAS_CORETYPE")) : NULL;
    char *user_threads =
        getenv("OPENBLAS_NUM_THREADS") ? strdup(getenv("OPENBLAS_NUM_THREADS")) : NULL;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);

    fsdp_cpu_gemm_isa cpu = fsdp_cpu_gemm_isa_of_cpu();
    const char *name = NULL, *first = NULL;
    char first_buf[64] = "";
    g_blas.status = FSDP_STATUS_UNSUPPORTED; /* until loaded */
    /* Linked into the program (or loaded by another library) already: its
     * constructor has run, and unloading it is impossible. */
    void *early = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
    bool preloaded = early != NULL;
    if (early)
        dlclose(early);
    bool ok = openblas_load(pin, &name);
    if (ok && !pin) {
        const char *want = fsdp_cpu_openblas_override(name, cpu);
        if (want) {
            snprintf(first_buf, sizeof first_buf, "%s", name);
            first = first_buf;
            dlclose(g_blas.handle);
            g_blas.handle = NULL;
            ok = openblas_load(want, &name);
        }
    }
    bool user_asked = user_core != NULL;
    env_put("OPENBLAS_CORETYPE", user_core);
    env_put("OPENBLAS_NUM_THREADS", user_threads);
    free(user_core);
    free(user_threads);
    if (!ok)
        return;

    g_blas.openblas_only = openblas_only;
    snprintf(g_blas.core, sizeof g_blas.core, "%s", name);
    fsdp_cpu_gemm_isa got = fsdp_cpu_openblas_core_isa(name);
    char how[96] = "";
    if (first && !fsdp_cpu_openblas_override(name, cpu))
        snprintf(how, sizeof how, ", chosen from the CPU's features: %s %s", user_asked ?
                 "OPENBLAS_CORETYPE asked for" : "OpenBLAS picked", first);
    else if (pin || openblas_only)
        snprintf(how, sizeof how, ", pinned by FSDP_CPU_GEMM");
    snprintf(g_blas.openblas, sizeof g_blas.openblas, "OpenBLAS %s %s kernel (%s%s)",
             openblas_version(), name, isa_name(got), how);
    if (pin && strcasecmp(pin, name))
        snprintf(g_blas.warn, sizeof g_blas.warn,
                 "FSDP_CPU_GEMM pins OpenBLAS core '%s' but OpenBLAS runs '%s' (it does not know "
                 "that core, or this CPU lacks its instructions)", pin, name);
    else if (!pin && fsdp_cpu_openblas_override(name, cpu))
        snprintf(g_blas.warn, sizeof g_blas.warn,
                 "OpenBLAS runs its slow %s kernel although this CPU (%s) could run %s: GEMMs "
                 "run at a fraction of the CPU's speed; %s", name, isa_name(cpu),
                 core_for_isa[cpu], preloaded ? "OpenBLAS was loaded before fsdp could choose "
                 "its kernel (is the program linked with -lopenblas? fsdp loads it itself)" :
                 "this OpenBLAS refused that kernel: try a newer OpenBLAS");
    else if (got != FSDP_CPU_GEMM_ISA_UNKNOWN && got < FSDP_CPU_GEMM_ISA_AVX2)
        snprintf(g_blas.warn, sizeof g_blas.warn,
                 "the GEMM kernel is OpenBLAS's slow %s fallback (%s): %s",
                 name, isa_name(got), pin ? "unset FSDP_CPU_GEMM for the fastest kernel" :
                 "this CPU has no AVX2/FMA, so nothing faster is available");
    g_blas.status = FSDP_STATUS_OK;
}

/* Before main: single-threaded, so the environment may be changed. */
__attribute__((constructor)) static void blas_load_at_start(void) { blas_load(); }

/* ---- queries and calls ------------------------------------------------- */

/* oneDNN is asked on first need, not at start: it compiles test kernels.
 * fp32 GEMMs go to oneDNN where it has brgemm kernels for fp32 (AVX-512):
 * there its kernels beat OpenBLAS's on every GEMM shape of the models
 * (tools/bench_gemm.c: 3-25% per shape, 9-10% of a step's GEMM time on one
 * Zen 4 core); elsewhere it has only its jit sgemm, not measured against
 * OpenBLAS, which stays. Attention's small products (alpha != 1) call
 * OpenBLAS directly either way. */
static void dnnl_probe(void)
{
    char bf16[160] = "widened to fp32 (pinned by FSDP_CPU_GEMM)", f32[160] = "";
    if (g_blas.status == FSDP_STATUS_OK && !g_blas.openblas_only) {
        g_blas.bf16_dot = fsdp_cpu_dnnl_probe(bf16, sizeof bf16);
        g_blas.f32_dnnl = fsdp_cpu_dnnl_probe_f32(f32, sizeof f32);
    }
    if (g_blas.f32_dnnl)
        snprintf(g_blas.desc, sizeof g_blas.desc, "fp32: %s (attention: %s); bf16: %s", f32,
                 g_blas.openblas, bf16);
    else
        snprintf(g_blas.desc, sizeof g_blas.desc, "fp32: %s; bf16: %s", g_blas.openblas, bf16);
}

fsdp_status fsdp_cpu_blas_status(void)
{
    if (g_blas.status == FSDP_STATUS_OK)
        return FSDP_STATUS_OK;
    return fsdp_error_set(g_blas.status, "%s",
                          g_blas.err[0] ? g_blas.err : "cpu backend: GEMM libraries not loaded");
}

const char *fsdp_cpu_blas_describe(void)
{
    pthread_once(&dnnl_once, dnnl_probe);
    return g_blas.status == FSDP_STATUS_OK ? g_blas.desc : "no GEMM library (see the error)";
}

const char *fsdp_cpu_blas_warning(void)
{
    if (g_blas.status != FSDP_STATUS_OK)
        return g_blas.err;
    return g_blas.warn[0] ? g_blas.warn : NULL;
}

const char *fsdp_cpu_blas_core(void) { return g_blas.core; }

bool fsdp_cpu_blas_bf16_dot(void)
{
    pthread_once(&dnnl_once, dnnl_probe);
    return g_blas.bf16_dot;
}

bool fsdp_cpu_blas_f32_dnnl(void)
{
    pthread_once(&dnnl_once, dnnl_probe);
    return g_blas.f32_dnnl;
}

void fsdp_cpu_blas_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    g_blas.sgemm(CBLAS_ROW_MAJOR, ta ? CBLAS_TRANS : CBLAS_NO_TRANS,
                 tb ? CBLAS_TRANS : CBLAS_NO_TRANS, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
