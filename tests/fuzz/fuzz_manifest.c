/*
 * fuzz_manifest.c - libFuzzer target for checkpoint manifests
 * (fsdp_ckpt_manifest_read), and for manifests that parse and describe a
 * GPT-2, the check against the model built from them.
 */
#include "ckpt/ckpt.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_temp_file(data, size, ".manifest");
    fsdp_ckpt_manifest man;
    if (fsdp_ckpt_manifest_read(path, &man) != FSDP_STATUS_OK)
        return 0;
    fsdp_model m;
    if (man.has_gpt2 && fsdp_gpt2_init(&m, &man.gpt2) == FSDP_STATUS_OK) {
        (void)fsdp_ckpt_manifest_check_model(&man, path, &m);
        fsdp_model_free(&m);
    }
    for (int u = 0; u < man.n_units; u++)
        for (int r = 0; r < 3; r++)
            (void)fsdp_ckpt_shard_first(&man, u, r);
    fsdp_ckpt_manifest_free(&man);
    return 0;
}
