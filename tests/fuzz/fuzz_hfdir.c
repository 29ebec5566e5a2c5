/*
 * fuzz_hfdir.c - libFuzzer target for the two JSON files of a Hugging Face
 * model directory (src/ckpt/hfdir.c): the first byte picks the reader,
 * the rest is the file. Even: model.safetensors.index.json
 * (fsdp_hfdir_parse_index, weight_map read one member at a time); odd:
 * config.json (fsdp_hfdir_parse_config: model_type, architectures and the
 * family's hf_config), and for a config that passes, the model it names
 * is built.
 */
#include "ckpt/hfdir.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] % 2 == 0) {
        fsdp_hfdir_index x;
        if (fsdp_hfdir_parse_index("fuzz index", text, n, &x) != FSDP_STATUS_OK)
            return 0;
        for (int i = 0; i < x.n_tensors; i++)
            if (x.file_of[i] < 0 || x.file_of[i] >= x.n_files)
                abort(); /* every entry names one of the files */
        fsdp_hfdir_index_free(&x);
        return 0;
    }
    const fsdp_model_family *f = NULL;
    char config[FSDP_MODEL_CONFIG_MAX];
    if (fsdp_hfdir_parse_config("fuzz config.json", text, n, &f, config, sizeof config, NULL) !=
        FSDP_STATUS_OK)
        return 0;
    if (!f)
        abort();
    fsdp_model m;
    if (fsdp_model_build(f, config, &m) == FSDP_STATUS_OK)
        fsdp_model_free(&m);
    return 0;
}
