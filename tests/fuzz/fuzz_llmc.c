/*
 * fuzz_llmc.c - libFuzzer target for llm.c model files: the header and
 * size checks of the "llmc" weight format, and on whatever they accept,
 * the model build, the bind and the range reader (whole units against
 * shifted sub-ranges, which must agree element for element).
 */
#include "ckpt/modelfile.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_temp_file(data, size, ".bin");
    fsdp_modelfile *mf = NULL;
    if (fsdp_modelfile_open(&mf, path) != FSDP_STATUS_OK)
        return 0;
    fsdp_model m;
    if (fsdp_model_build(fsdp_modelfile_family(mf), fsdp_modelfile_config(mf), &m) !=
        FSDP_STATUS_OK)
        abort(); /* the header check accepted a config the family refuses */
    if (fsdp_modelfile_bind(mf, &m) != FSDP_STATUS_OK)
        abort(); /* opening validated the size: binding cannot fail */
    for (int u = 0; u < m.n_units; u++) {
        size_t n = m.units[u].numel;
        float *whole = malloc((n + 8) * sizeof *whole), *part = malloc((n + 8) * sizeof *part);
        if (fsdp_modelfile_read_range(mf, u, 0, n, whole) != FSDP_STATUS_OK ||
            fsdp_modelfile_read_range(mf, u, 1, n + 8, part) != FSDP_STATUS_OK ||
            memcmp(part, whole + 1, (n - 1) * sizeof *part))
            abort(); /* two reads of one valid file disagree */
        for (size_t i = n - 1; i < n + 7; i++)
            if (part[i] != 0.0f)
                abort(); /* padding reads as zero */
        free(whole);
        free(part);
    }
    fsdp_modelfile_close(mf);
    fsdp_model_free(&m);
    return 0;
}
