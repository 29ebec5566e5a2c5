/*
 * fuzz_manifest.c - libFuzzer target for checkpoint manifests of every
 * version (fsdp_ckpt_manifest_read). Whatever the reader accepts must hold
 * together: the model it records builds and its unit lines are that
 * model's, the model checks against the manifest, and writing the manifest
 * back and reading it again gives the same
 * model, units, run fields, each parameter's rows per shard and carried
 * tokenizer files (written back as version 4, or 3 when the shards are
 * flat ranges).
 */
#include "ckpt/ckpt.h"
#include "fuzz_common.h"

static const char *second_path(void)
{
    static char p[256];
    if (!p[0])
        snprintf(p, sizeof p, "/tmp/fsdp_fuzz_%ld.rewritten", (long)getpid());
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_temp_file(data, size, ".manifest");
    fsdp_ckpt_manifest man, back;
    if (fsdp_ckpt_manifest_read(path, &man) != FSDP_STATUS_OK)
        return 0;
    fsdp_model m;
    if (fsdp_ckpt_manifest_model(&man, path, &m) != FSDP_STATUS_OK)
        abort(); /* the reader accepted a model it cannot rebuild */
    if (fsdp_ckpt_manifest_check_model(&man, path, &m) != FSDP_STATUS_OK)
        abort(); /* ... or one that does not match its own lines */
    for (int u = 0; u < man.n_units; u++)
        for (int r = 0; r < 3; r++)
            (void)fsdp_ckpt_shard_first(&man, u, r);
    const char *again = second_path();
    if (fsdp_ckpt_manifest_write(again, &man) != FSDP_STATUS_OK ||
        fsdp_ckpt_manifest_read(again, &back) != FSDP_STATUS_OK)
        abort(); /* an accepted manifest must survive a rewrite */
    if (strcmp(back.model_family, man.model_family) ||
        strcmp(back.model_config, man.model_config) || back.n_units != man.n_units ||
        back.step != man.step || back.world_size != man.world_size ||
        back.data_sequences != man.data_sequences ||
        back.version != (man.version >= 4 ? FSDP_CKPT_VERSION : 3) || /* flat: version 3 */
        back.n_tok_files != man.n_tok_files)
        abort();
    for (int i = 0; i < man.n_tok_files; i++)
        if (strcmp(back.tok_files[i].name, man.tok_files[i].name) ||
            back.tok_files[i].size_bytes != man.tok_files[i].size_bytes ||
            back.tok_files[i].xxh64 != man.tok_files[i].xxh64)
            abort();
    for (int u = 0; u < man.n_units; u++) {
        if (back.units[u].shard_numel != man.units[u].shard_numel ||
            back.units[u].n_params != man.units[u].n_params)
            abort();
        for (int i = 0; i < man.units[u].n_params; i++) { /* version 4's rows, or none */
            const fsdp_ckpt_param *a = &man.units[u].params[i], *b = &back.units[u].params[i];
            size_t flat, at;
            if (a->shard_rows != b->shard_rows || a->shard_at != b->shard_at)
                abort();
            for (int k = 0; k < 3; k++) /* a file's run stays inside the parameter */
                if (fsdp_ckpt_param_run(&man, u, a, k, &flat, &at) &&
                    (flat < a->offset || flat >= a->offset + a->numel))
                    abort();
        }
    }
    unlink(again);
    fsdp_ckpt_manifest_free(&back);
    fsdp_model_free(&m);
    fsdp_ckpt_manifest_free(&man);
    return 0;
}
