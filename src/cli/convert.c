/*
 * convert.c - `fsdp convert IN OUT`: move model weights between any two
 * weight formats (src/ckpt/modelfile.h: an fsdp checkpoint directory, an
 * llm.c model file, a Hugging Face .safetensors file), in any direction the
 * model's family has names for.
 *
 * The format of each side comes from its form (fsdp_modelfile_format_of):
 * *.bin llm.c, *.safetensors HF, a directory or a path without extension a
 * checkpoint.
 * IN is validated completely before anything is written; OUT is written
 * atomically. The whole model passes through host memory once (fp32).
 * fp32 conversions are bit-exact; --dtype bf16 rounds to nearest even.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "ckpt/modelfile.h"

int fsdp_cli_convert(int argc, char **argv)
{
    const char *dtype = "fp32";
    bool quiet = false;
    fsdp_opt opts[] = {
        {.name = "dtype", .type = FSDP_OPT_STR, .dst = &dtype, .metavar = "fp32|bf16",
         .help = "element type of an llm.c or safetensors OUT (default fp32; checkpoints are "
                 "always fp32)"},
        {.name = "quiet", .type = FSDP_OPT_FLAG, .dst = &quiet, .metavar = "",
         .help = "print nothing on success"},
    };
    const char *pos[2];
    int n_pos = 0;
    int rc = fsdp_args_parse("convert",
                             "IN OUT [--dtype fp32|bf16]   (IN, OUT: CKPT_DIR | FILE.bin | "
                             "FILE.safetensors)",
                             opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, pos, 2, &n_pos);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if (n_pos != 2) {
        fprintf(stderr, "fsdp convert: need IN and OUT (a checkpoint directory, FILE.bin or "
                        "FILE.safetensors each)\n");
        return 2;
    }
    fsdp_dtype dt;
    if (!strcmp(dtype, "fp32")) {
        dt = FSDP_DTYPE_F32;
    } else if (!strcmp(dtype, "bf16")) {
        dt = FSDP_DTYPE_BF16;
    } else {
        fprintf(stderr, "fsdp convert: --dtype: unknown value '%s' (expected fp32|bf16)\n", dtype);
        return 2;
    }
    const fsdp_modelfile_format *out_fmt = fsdp_modelfile_format_of(pos[1]);
    if (out_fmt == fsdp_modelfile_format_find("ckpt") && dt != FSDP_DTYPE_F32) {
        fprintf(stderr, "fsdp convert: checkpoints hold fp32 parameters; drop --dtype %s or "
                        "write a .bin or .safetensors file\n", dtype);
        return 2;
    }
    fsdp_modelfile *mf = NULL;
    fsdp_model m;
    float **units = NULL;
    fsdp_status st = fsdp_modelfile_resolve(pos[0], &m, &mf);
    if (st == FSDP_STATUS_OK && !mf) {
        fsdp_model_free(&m);
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "IN '%s' names a model shape, not weights; "
                            "give a checkpoint directory, FILE.bin or FILE.safetensors", pos[0]);
    }
    if (st != FSDP_STATUS_OK)
        goto fail;
    units = calloc((size_t)m.n_units, sizeof *units);
    if (!units) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        goto fail;
    }
    for (int u = 0; u < m.n_units; u++) {
        units[u] = malloc(m.units[u].numel * sizeof(float) + 1);
        if (!units[u]) {
            char b[32];
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for unit '%s' (%s)",
                                m.units[u].name,
                                fsdp_fmt_bytes(b, sizeof b, 4.0 * (double)m.units[u].numel));
            goto fail;
        }
        if ((st = fsdp_modelfile_read_range(mf, u, 0, m.units[u].numel, units[u])) !=
            FSDP_STATUS_OK)
            goto fail;
    }
    st = fsdp_modelfile_write(pos[1], out_fmt, &m, (const float *const *)units, dt);
    if (st == FSDP_STATUS_OK && !quiet)
        printf("converted %s '%s' (%s, model %s, %.2fM parameters) to %s '%s' (%s)\n",
               fsdp_modelfile_format_name(fsdp_modelfile_format_get(mf)),
               fsdp_modelfile_path(mf), fsdp_modelfile_dtype_name(mf), m.name,
               (double)m.numel / 1e6, fsdp_modelfile_format_name(out_fmt), pos[1],
               out_fmt == fsdp_modelfile_format_find("ckpt") ? "fp32, step 0, 1 device" : dtype);
fail:
    if (st != FSDP_STATUS_OK)
        fprintf(stderr, "fsdp convert: error: %s\n", fsdp_error_msg());
    if (units)
        for (int u = 0; u < m.n_units; u++)
            free(units[u]);
    free(units);
    fsdp_modelfile_close(mf); /* bound to the model: closed first */
    fsdp_model_free(&m);      /* zeroed when resolving failed */
    if (st != FSDP_STATUS_OK)
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    return 0;
}
