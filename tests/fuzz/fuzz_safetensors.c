/*
 * fuzz_safetensors.c - libFuzzer target for safetensors files: header
 * parsing and validation from memory (fsdp_st_parse_buffer), the model the
 * tensors describe (the families' mappings, fsdp_st_model), and for files
 * that pass, opening the same bytes on disk and the range reader.
 */
#include "ckpt/modelfile.h"
#include "ckpt/safetensors.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fsdp_st_file f;
    if (fsdp_st_parse_buffer("fuzz.safetensors", data, size, &f) != FSDP_STATUS_OK)
        return 0;
    fsdp_model m;
    fsdp_status st = fsdp_st_model(&f, &m);
    fsdp_st_free(&f);
    if (st != FSDP_STATUS_OK)
        return 0;
    const char *path = fuzz_temp_file(data, size, ".safetensors");
    fsdp_modelfile *mf = NULL;
    if (fsdp_modelfile_open(&mf, path) != FSDP_STATUS_OK || fsdp_modelfile_bind(mf, &m) !=
                                                                  FSDP_STATUS_OK)
        abort(); /* the same bytes passed from memory */
    for (int u = 0; u < m.n_units; u++) {
        size_t n = m.units[u].numel;
        float *buf = malloc((n + 8) * sizeof *buf);
        if (fsdp_modelfile_read_range(mf, u, n / 3, n + 8, buf) != FSDP_STATUS_OK)
            abort();
        free(buf);
    }
    fsdp_modelfile_close(mf);
    fsdp_model_free(&m);
    return 0;
}
