/*
 * fuzz_llmc.c - libFuzzer target for llm.c model files: the header check
 * (fsdp_llmc_read_config), the whole-file reader (fsdp_llmc_read) and the
 * range reader of src/ckpt/modelfile.c on whatever the header accepted.
 */
#include "ckpt/llmc.h"
#include "ckpt/modelfile.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_temp_file(data, size, ".bin");
    fsdp_gpt2_config cfg;
    fsdp_dtype dt;
    if (fsdp_llmc_read_config(path, &cfg, &dt) != FSDP_STATUS_OK)
        return 0;
    fsdp_model m;
    if (fsdp_gpt2_init(&m, &cfg) != FSDP_STATUS_OK)
        abort(); /* the header check accepted a config the model refuses */
    float **units = calloc((size_t)m.n_units, sizeof *units);
    for (int u = 0; u < m.n_units; u++)
        units[u] = malloc(m.units[u].numel * sizeof(float) + 4);
    fsdp_status st = fsdp_llmc_read(path, &m, units);
    fsdp_modelfile *mf = NULL;
    if (st == FSDP_STATUS_OK && fsdp_modelfile_open(&mf, path) == FSDP_STATUS_OK &&
        fsdp_modelfile_bind(mf, &m) == FSDP_STATUS_OK) {
        for (int u = 0; u < m.n_units; u++) {
            size_t n = m.units[u].numel;
            float *buf = malloc((n + 8) * sizeof *buf);
            if (fsdp_modelfile_read_range(mf, u, 1, n + 8, buf) != FSDP_STATUS_OK ||
                memcmp(buf, units[u] + 1, (n - 1) * sizeof *buf))
                abort(); /* the two readers disagree on a valid file */
            free(buf);
        }
    }
    fsdp_modelfile_close(mf);
    for (int u = 0; u < m.n_units; u++)
        free(units[u]);
    free(units);
    fsdp_model_free(&m);
    return 0;
}
