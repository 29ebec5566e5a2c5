/*
 * dnnl.c - bf16 and fp32 GEMMs through oneDNN 2.x matmul primitives
 * (contract in dnnl.h).
 *
 * A primitive is made per GEMM shape (sizes, strides, transposes, beta) and
 * kept in the context's small cache: creating one compiles its kernel
 * (milliseconds), running one is the GEMM. beta = 1 is a "sum" post-op, so
 * the fp32 product is added to C once. Scratchpads are user-managed, one
 * per worker, so concurrent runs never share oneDNN's memory. oneDNN here
 * uses OpenMP; every thread that calls it sets its own OpenMP thread count
 * to 1 first, so no OpenMP team is ever started.
 *
 * Ranks never share oneDNN objects: its global primitive cache is turned
 * off (each context caches its own), and engines and primitives are
 * created under one process mutex. oneDNN synchronises its internal state
 * with primitives ThreadSanitizer cannot see (it is not instrumented); the
 * mutex makes that order visible, and creation is rare (once per shape and
 * rank), so it costs nothing. The probes also run their primitive once
 * under it, so that the lazy state oneDNN sets up on a first execution is
 * made before any rank executes (probe_run).
 */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/dnnl.h"

#define DNNL_MAX_PRIMS 64

struct fsdp_cpu_dnnl_prim {
    fsdp_cpu_dnnl_shape shape;
    dnnl_primitive_t prim;
    char impl[48];           /* oneDNN's kernel name, "brg:avx512_core" */
    dnnl_memory_desc_t a_md, b_md, c_md, scratch_md;
    size_t scratch_bytes;
};

struct fsdp_cpu_dnnl {
    dnnl_engine_t engine;
    fsdp_cpu_dnnl_prim *prims[DNNL_MAX_PRIMS];
    unsigned long last_use[DNNL_MAX_PRIMS];    /* for evicting the least recently used */
    unsigned long clock;
    int n_prims;
    int n_workers;
    dnnl_stream_t *streams;  /* (n_workers,) */
    void **scratch;          /* (n_workers,) */
    size_t scratch_bytes;    /* capacity of each scratch[w] */
};

static _Thread_local bool omp_single;
static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER; /* engine/primitive creation */

/* oneDNN on this thread uses one OpenMP thread (our team is the parallelism). */
static void omp_one_thread(void)
{
    if (!omp_single) {
        omp_set_num_threads(1);
        omp_single = true;
    }
}

static fsdp_status dnnl_fail(dnnl_status_t s, const char *what)
{
    return fsdp_error_set(s == dnnl_out_of_memory ? FSDP_STATUS_OOM : FSDP_STATUS_INTERNAL,
                          "cpu ops: oneDNN %s failed (dnnl_status %d); set FSDP_CPU_GEMM=openblas "
                          "to run every GEMM in OpenBLAS instead", what, (int)s);
}

#define DNNL_TRY(call, what)                      \
    do {                                          \
        dnnl_status_t ds_ = (call);               \
        if (ds_ != dnnl_success) {                \
            st = dnnl_fail(ds_, what);            \
            goto fail;                            \
        }                                         \
    } while (0)

static const char *pd_impl(const_dnnl_primitive_desc_t pd)
{
    const char *impl = "?";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    return impl;
}

/* The primitive descriptor for md: oneDNN's first choice, except that for
 * an fp32 product with neither operand transposed (dx = dy w) its jit sgemm
 * is taken over brgemm where it offers both. On one Zen 4 core the jit
 * sgemm ran such tiles (128 x 768, K 768 to 50304) at 113-115 GFLOP/s,
 * brgemm at 115 for K 768 and less as K grows (108 at 2304, 84 at 32000);
 * with a transposed B (x w^T) brgemm is the faster one (104 against 89 at
 * K 3072). The choice depends on the shape only. */
static dnnl_status_t pd_create(dnnl_primitive_desc_t *pd, const dnnl_matmul_desc_t *md,
                               const_dnnl_primitive_attr_t attr, dnnl_engine_t e,
                               const fsdp_cpu_dnnl_shape *sh)
{
    if (!sh->f32 || sh->ta || sh->tb)
        return dnnl_primitive_desc_create(pd, md, attr, e, NULL);
    dnnl_primitive_desc_iterator_t it = NULL;
    dnnl_status_t ds = dnnl_primitive_desc_iterator_create(&it, md, attr, e, NULL);
    if (ds != dnnl_success)
        return ds;
    *pd = dnnl_primitive_desc_iterator_fetch(it);
    if (*pd && !strncmp(pd_impl(*pd), "brg", 3) &&
        dnnl_primitive_desc_iterator_next(it) == dnnl_success) {
        dnnl_primitive_desc_t next = dnnl_primitive_desc_iterator_fetch(it);
        if (next && !strncmp(pd_impl(next), "gemm:jit", 8)) {
            dnnl_primitive_desc_destroy(*pd);
            *pd = next;
        } else if (next) {
            dnnl_primitive_desc_destroy(next);
        }
    }
    dnnl_primitive_desc_iterator_destroy(it);
    return *pd ? dnnl_success : dnnl_unimplemented;
}

/* A matmul primitive for `sh` on engine e; create_mu held. */
static fsdp_status prim_create_locked(dnnl_engine_t e, const fsdp_cpu_dnnl_shape *sh,
                                      fsdp_cpu_dnnl_prim **out)
{
    fsdp_status st = FSDP_STATUS_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    fsdp_cpu_dnnl_prim *p = calloc(1, sizeof *p);
    if (!p)
        return fsdp_error_set(FSDP_STATUS_OOM, "cpu ops: out of host memory for a oneDNN matmul");
    p->shape = *sh;
    dnnl_dims_t a_dims = {sh->M, sh->K}, b_dims = {sh->K, sh->N}, c_dims = {sh->M, sh->N};
    dnnl_dims_t a_str = {sh->ta ? 1 : sh->lda, sh->ta ? sh->lda : 1};
    dnnl_dims_t b_str = {sh->tb ? 1 : sh->ldb, sh->tb ? sh->ldb : 1};
    dnnl_dims_t c_str = {sh->ldc, 1};
    dnnl_data_type_t in = sh->f32 ? dnnl_f32 : dnnl_bf16;
    DNNL_TRY(dnnl_memory_desc_init_by_strides(&p->a_md, 2, a_dims, in, a_str), "memory desc");
    DNNL_TRY(dnnl_memory_desc_init_by_strides(&p->b_md, 2, b_dims, in, b_str), "memory desc");
    DNNL_TRY(dnnl_memory_desc_init_by_strides(&p->c_md, 2, c_dims, dnnl_f32, c_str), "memory desc");
    dnnl_matmul_desc_t md;
    DNNL_TRY(dnnl_matmul_desc_init(&md, &p->a_md, &p->b_md, NULL, &p->c_md), "matmul desc");
    DNNL_TRY(dnnl_primitive_attr_create(&attr), "attr");
    DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "attr");
    if (sh->beta != 0.0f) {
        DNNL_TRY(dnnl_post_ops_create(&po), "post-ops");
        DNNL_TRY(dnnl_post_ops_append_sum(po, 1.0f), "post-ops");
        DNNL_TRY(dnnl_primitive_attr_set_post_ops(attr, po), "post-ops");
    }
    DNNL_TRY(pd_create(&pd, &md, attr, e, sh), "matmul primitive desc");
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (smd) {
        p->scratch_md = *smd;
        p->scratch_bytes = dnnl_memory_desc_get_size(smd);
    }
    snprintf(p->impl, sizeof p->impl, "%s", pd_impl(pd));
    DNNL_TRY(dnnl_primitive_create(&p->prim, pd), "matmul primitive");
    *out = p;
    p = NULL;
fail:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    free(p);
    return st;
}

static fsdp_status prim_create(dnnl_engine_t e, const fsdp_cpu_dnnl_shape *sh,
                               fsdp_cpu_dnnl_prim **out)
{
    pthread_mutex_lock(&create_mu);
    fsdp_status st = prim_create_locked(e, sh, out);
    pthread_mutex_unlock(&create_mu);
    return st;
}

/* An engine; false if oneDNN refuses. */
static bool engine_create(dnnl_engine_t *e)
{
    pthread_mutex_lock(&create_mu);
    bool ok = dnnl_engine_create(e, dnnl_cpu, 0) == dnnl_success;
    pthread_mutex_unlock(&create_mu);
    return ok;
}

static void prim_free(fsdp_cpu_dnnl_prim *p)
{
    if (!p)
        return;
    if (p->prim) {
        pthread_mutex_lock(&create_mu);
        dnnl_primitive_destroy(p->prim);
        pthread_mutex_unlock(&create_mu);
    }
    free(p);
}

/* Before oneDNN's first use (the probes). */
static void dnnl_setup(void)
{
    omp_one_thread();
    pthread_mutex_lock(&create_mu);
    dnnl_set_primitive_cache_capacity(0); /* each context caches its own */
    pthread_mutex_unlock(&create_mu);
}

/* Run p once on zeros, under the creation mutex. oneDNN's first execution
 * in a process initialises state of its own (its ITT task hooks: a mutex
 * published through an atomic counter ThreadSanitizer cannot see); done
 * here, before any rank runs a GEMM, that order is visible too. */
static bool probe_run(dnnl_engine_t e, const fsdp_cpu_dnnl_prim *p)
{
    fsdp_status st = FSDP_STATUS_OK;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t m[4] = {NULL, NULL, NULL, NULL};
    const dnnl_memory_desc_t *mds[4] = {&p->a_md, &p->b_md, &p->c_md, &p->scratch_md};
    const int kinds[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
    void *buf[4] = {NULL, NULL, NULL, NULL};
    dnnl_exec_arg_t args[4];
    int n_args = p->scratch_bytes > 0 ? 4 : 3;
    pthread_mutex_lock(&create_mu);
    DNNL_TRY(dnnl_stream_create(&stream, e, dnnl_stream_default_flags), "stream");
    for (int i = 0; i < n_args; i++) {
        if (!(buf[i] = calloc(1, dnnl_memory_desc_get_size(mds[i])))) {
            st = FSDP_STATUS_OOM;
            goto fail;
        }
        DNNL_TRY(dnnl_memory_create(&m[i], mds[i], e, buf[i]), "memory");
        args[i] = (dnnl_exec_arg_t){kinds[i], m[i]};
    }
    DNNL_TRY(dnnl_primitive_execute(p->prim, stream, n_args, args), "matmul");
    DNNL_TRY(dnnl_stream_wait(stream), "stream wait");
fail:
    for (int i = 0; i < 4; i++) {
        if (m[i])
            dnnl_memory_destroy(m[i]);
        free(buf[i]);
    }
    if (stream)
        dnnl_stream_destroy(stream);
    pthread_mutex_unlock(&create_mu);
    return st == FSDP_STATUS_OK;
}

/* The kernel oneDNN picks for a 64x64x64 x w^T of fp32 (f32) or bf16
 * operands, into impl; false if it builds or runs none. */
static bool probe_impl(bool f32, char *impl, size_t cap)
{
    dnnl_engine_t e = NULL;
    fsdp_cpu_dnnl_prim *p = NULL;
    bool ok = false;
    /* x w^T, the forward's product: NN fp32 products prefer the jit sgemm */
    fsdp_cpu_dnnl_shape sh = {.f32 = f32, .tb = true, .M = 64, .N = 64, .K = 64, .lda = 64,
                              .ldb = 64, .ldc = 64};
    if (engine_create(&e) && prim_create(e, &sh, &p) == FSDP_STATUS_OK && probe_run(e, p)) {
        snprintf(impl, cap, "%s", p->impl);
        ok = true;
    }
    prim_free(p);
    if (e) {
        pthread_mutex_lock(&create_mu);
        dnnl_engine_destroy(e);
        pthread_mutex_unlock(&create_mu);
    }
    return ok;
}

bool fsdp_cpu_dnnl_probe(char *desc, size_t cap)
{
    dnnl_setup();
    const dnnl_version_t *v = dnnl_version();
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const unsigned bf16_bits = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    if (((unsigned)isa & bf16_bits) != bf16_bits) {
        snprintf(desc, cap, "widened to fp32 (this CPU has no bf16 dot-product instructions)");
        return false;
    }
    char impl[48];
    if (!probe_impl(false, impl, sizeof impl)) {
        snprintf(desc, cap, "widened to fp32 (oneDNN could not build a bf16 matmul)");
        return false;
    }
    /* brg:avx512_core_bf16 or brg:avx512_core_amx; a reference or emulated
     * kernel would be slower than fp32 OpenBLAS */
    bool ok = !strstr(impl, "ref") && (strstr(impl, "bf16") || strstr(impl, "amx"));
    snprintf(desc, cap, ok ? "oneDNN %d.%d.%d %s" : "widened to fp32 (oneDNN %d.%d.%d has only "
                                                  "%s for bf16 here)",
             v->major, v->minor, v->patch, impl);
    return ok;
}

bool fsdp_cpu_dnnl_probe_f32(char *desc, size_t cap)
{
    dnnl_setup();
    const dnnl_version_t *v = dnnl_version();
    char impl[48];
    if (!probe_impl(true, impl, sizeof impl)) {
        snprintf(desc, cap, "oneDNN could not build an fp32 matmul");
        return false;
    }
    /* brg:avx512_core (or wider); gemm:jit (AVX2 and older) is oneDNN's own
     * sgemm, no faster than OpenBLAS's kernels */
    bool ok = !strncmp(impl, "brg:", 4);
    snprintf(desc, cap, ok ? "oneDNN %d.%d.%d %s kernels" : "oneDNN %d.%d.%d has only %s for "
                                                          "fp32 here",
             v->major, v->minor, v->patch, ok ? impl + 4 : impl);
    return ok;
}

/* Streams and scratchpads for n workers of at least `bytes` each. */
static fsdp_status workers_reserve(fsdp_cpu_dnnl *s, int n, size_t bytes)
{
    if (n > s->n_workers) {
        dnnl_stream_t *st = realloc(s->streams, (size_t)n * sizeof *st);
        void **sc = st ? realloc(s->scratch, (size_t)n * sizeof *sc) : NULL;
        if (st)
            s->streams = st;
        if (!st || !sc)
            return fsdp_error_set(FSDP_STATUS_OOM, "cpu ops: out of host memory for oneDNN "
                                                   "streams");
        s->scratch = sc;
        for (int w = s->n_workers; w < n; w++) {
            s->scratch[w] = NULL;
            pthread_mutex_lock(&create_mu);
            dnnl_status_t ds = dnnl_stream_create(&s->streams[w], s->engine,
                                                  dnnl_stream_default_flags);
            pthread_mutex_unlock(&create_mu);
            if (ds != dnnl_success) {
                s->n_workers = w;
                return fsdp_error_set(FSDP_STATUS_INTERNAL, "cpu ops: oneDNN stream creation "
                                                            "failed");
            }
            if (s->scratch_bytes > 0 && !(s->scratch[w] = malloc(s->scratch_bytes))) {
                dnnl_stream_destroy(s->streams[w]);
                s->n_workers = w;
                return fsdp_error_set(FSDP_STATUS_OOM, "cpu ops: out of host memory for "
                                                       "oneDNN scratchpads");
            }
        }
        s->n_workers = n;
    }
    if (bytes > s->scratch_bytes) {
        for (int w = 0; w < s->n_workers; w++) {
            free(s->scratch[w]);
            s->scratch[w] = NULL;
        }
        s->scratch_bytes = 0;
        for (int w = 0; w < s->n_workers; w++)
            if (!(s->scratch[w] = malloc(bytes)))
                return fsdp_error_set(FSDP_STATUS_OOM, "cpu ops: out of host memory for %d "
                                      "oneDNN scratchpads of %zu bytes", s->n_workers, bytes);
        s->scratch_bytes = bytes;
    }
    return FSDP_STATUS_OK;
}

static bool shape_eq(const fsdp_cpu_dnnl_shape *a, const fsdp_cpu_dnnl_shape *b)
{
    return a->f32 == b->f32 && a->ta == b->ta && a->tb == b->tb && a->M == b->M &&
           a->N == b->N && a->K == b->K && a->lda == b->lda && a->ldb == b->ldb &&
           a->ldc == b->ldc && a->beta == b->beta;
}

fsdp_status fsdp_cpu_dnnl_prepare(fsdp_cpu_dnnl **state, const fsdp_cpu_dnnl_shape *shape,
                                  int n_workers, fsdp_cpu_dnnl_prim **out)
{
    omp_one_thread();
    fsdp_cpu_dnnl *s = *state;
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s)
            return fsdp_error_set(FSDP_STATUS_OOM, "cpu ops: out of host memory for oneDNN");
        if (!engine_create(&s->engine)) {
            free(s);
            return fsdp_error_set(FSDP_STATUS_INTERNAL, "cpu ops: oneDNN cpu engine creation "
                                                        "failed");
        }
        *state = s;
    }
    fsdp_cpu_dnnl_prim *p = NULL;
    int slot = -1;
    for (int i = 0; i < s->n_prims && slot < 0; i++)
        if (shape_eq(&s->prims[i]->shape, shape))
            slot = i;
    if (slot < 0) {
        FSDP_TRY(prim_create(s->engine, shape, &p));
        if (s->n_prims < DNNL_MAX_PRIMS) {
            slot = s->n_prims++;
        } else { /* replace the least recently used: never one prepared just before */
            slot = 0;
            for (int i = 1; i < DNNL_MAX_PRIMS; i++)
                if (s->last_use[i] < s->last_use[slot])
                    slot = i;
            prim_free(s->prims[slot]);
        }
        s->prims[slot] = p;
    }
    p = s->prims[slot];
    s->last_use[slot] = ++s->clock;
    FSDP_TRY(workers_reserve(s, n_workers, p->scratch_bytes));
    *out = p;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_cpu_dnnl_run(fsdp_cpu_dnnl *s, const fsdp_cpu_dnnl_prim *p, int worker,
                              const void *A, const void *B, float *C)
{
    omp_one_thread();
    fsdp_status st = FSDP_STATUS_OK;
    dnnl_memory_t m[4] = {NULL, NULL, NULL, NULL};
    DNNL_TRY(dnnl_memory_create(&m[0], &p->a_md, s->engine, (void *)A), "memory");
    DNNL_TRY(dnnl_memory_create(&m[1], &p->b_md, s->engine, (void *)B), "memory");
    DNNL_TRY(dnnl_memory_create(&m[2], &p->c_md, s->engine, C), "memory");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]},
                               {DNNL_ARG_DST, m[2]}};
    int n_args = 3;
    if (p->scratch_bytes > 0) {
        DNNL_TRY(dnnl_memory_create(&m[3], &p->scratch_md, s->engine, s->scratch[worker]),
                 "memory");
        args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m[3]};
    }
    DNNL_TRY(dnnl_primitive_execute(p->prim, s->streams[worker], n_args, args), "matmul");
    DNNL_TRY(dnnl_stream_wait(s->streams[worker]), "stream wait");
fail:
    for (int i = 0; i < 4; i++)
        if (m[i])
            dnnl_memory_destroy(m[i]);
    return st;
}

const char *fsdp_cpu_dnnl_impl(const fsdp_cpu_dnnl_prim *p) { return p->impl; }

void fsdp_cpu_dnnl_free(fsdp_cpu_dnnl *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_prims; i++)
        prim_free(s->prims[i]);
    pthread_mutex_lock(&create_mu);
    for (int w = 0; w < s->n_workers; w++)
        dnnl_stream_destroy(s->streams[w]);
    dnnl_engine_destroy(s->engine);
    pthread_mutex_unlock(&create_mu);
    for (int w = 0; w < s->n_workers; w++)
        free(s->scratch[w]);
    free(s->streams);
    free(s->scratch);
    free(s);
}
