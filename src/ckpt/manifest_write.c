/*
 * manifest_write.c - the checkpoint manifest written as text, always in the
 * current version (manifest.h): `key value` lines, the units and their
 * parameters, `end`, and the checksum of everything before it.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <xxhash.h>

#include "ckpt/manifest.h"
#include "core/error.h"
#include "core/fileio.h"

/* Free text as one line: control characters become '?', empty becomes "-". */
static void sb_text(fsdp_sbuf *b, const char *key, const char *s)
{
    char tmp[FSDP_CKPT_MANIFEST_LINE_MAX];
    size_t n = 0;
    for (; s && *s && n + 1 < sizeof tmp - 64; s++)
        tmp[n++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    tmp[n] = '\0';
    fsdp_sbuf_printf(b, "%s %s\n", key, n ? tmp : "-");
}

fsdp_status fsdp_ckpt_manifest_write(const char *path, const fsdp_ckpt_manifest *m)
{
    fsdp_sbuf b = {0};
    /* version 3 for shards that are flat ranges (read from a checkpoint older than 4) */
    bool rows = true;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++)
            rows = rows && m->units[u].params[i].shard_rows;
    fsdp_sbuf_printf(&b, "# fsdp checkpoint manifest: `key value` lines; see src/ckpt/ckpt.h\n");
    fsdp_sbuf_printf(&b, "format fsdp-checkpoint\nversion %d\n", rows ? FSDP_CKPT_VERSION : 3);
    fsdp_sbuf_printf(&b, "run_id %016" PRIx64 "\n", m->run_id);
    fsdp_sbuf_printf(&b, "step %" PRIu64 "\nadam_t %" PRIu64 "\ndata_sequences %" PRIu64 "\n",
                     m->step, m->adam_t, m->data_sequences);
    fsdp_sbuf_printf(&b, "seed %" PRIu64 "\nworld_size %d\nshard %s\n", m->seed, m->world_size,
                     m->shard);
    if (!m->replicated && m->shard_ranks > 0 && m->shard_ranks != m->world_size)
        fsdp_sbuf_printf(&b, "shard_ranks %d\n", m->shard_ranks);
    fsdp_sbuf_printf(&b, "batch %d\nseq %d\ngrad_accum %d\nsteps_total %d\n", m->batch, m->seq,
              m->grad_accum, m->steps_total);
    fsdp_sbuf_printf(&b, "compute_dtype %s\nmaster_dtype fp32\noptim_dtype fp32\n",
                     m->compute_dtype);
    if (m->optimizer[0]) {
        fsdp_sbuf_printf(&b, "optimizer %s\noptim_state ", m->optimizer);
        for (int k = 0; k < m->n_optim_state; k++)
            fsdp_sbuf_printf(&b, "%s%s", k ? "," : "", m->optim_state[k]);
        fsdp_sbuf_printf(&b, "%s\n", m->n_optim_state ? "" : "-");
    } else {
        fsdp_sbuf_printf(&b, "optimizer adamw\noptim_state adam_m,adam_v\n");
    }
    sb_text(&b, "model_name", m->model_name);
    sb_text(&b, "model_family", m->model_family);
    sb_text(&b, "model_config", m->model_config);
    sb_text(&b, "data", m->data);
    sb_text(&b, "tokenizer", m->tokenizer);
    for (int i = 0; i < m->n_tok_files; i++) /* only when it carries them (manifest.h) */
        fsdp_sbuf_printf(&b, FSDP_CKPT_TOK_KEY " %s %" PRIu64 " %016" PRIx64 "\n",
                         m->tok_files[i].name, m->tok_files[i].size_bytes, m->tok_files[i].xxh64);
    if (m->chat_format[0]) /* optional (manifest.h) */
        sb_text(&b, "chat_format", m->chat_format);
    if (m->lora.r)
        fsdp_sbuf_printf(&b, "lora %d %.17g %d %s\n", m->lora.r, m->lora.alpha, m->lora.rslora,
                         m->lora.targets);
    if (m->freeze[0])
        sb_text(&b, "freeze", m->freeze);
    if (m->base[0])
        fsdp_sbuf_printf(&b, "base %016" PRIx64 " %s\n", m->base_hash, m->base);
    if (m->nf4)
        fsdp_sbuf_printf(&b, "quantize nf4\n");
    if (m->schedule[0]) /* optional (manifest.h) */
        fsdp_sbuf_printf(&b, "schedule %s %.9g %.17g %d %.9g\n", m->schedule, m->lr, m->min_lr,
                         m->warmup, m->decay_frac);
    if (m->eval_recorded)
        fsdp_sbuf_printf(&b, "eval_standing %.9g %" PRIu64 " %d\n", m->eval_best,
                         m->eval_best_step, m->eval_n_worse);
    fsdp_sbuf_printf(&b, "block_numel %zu\nunits %d\n", FSDP_CKPT_BLOCK_NUMEL, m->n_units);
    for (int u = 0; u < m->n_units; u++) {
        const fsdp_ckpt_unit *cu = &m->units[u];
        fsdp_sbuf_printf(&b, "unit %d %s numel %zu padded %zu shard %zu params %d\n", u, cu->name,
                  cu->numel, cu->padded_numel, cu->shard_numel, cu->n_params);
        for (int i = 0; i < cu->n_params; i++) {
            const fsdp_ckpt_param *p = &cu->params[i];
            fsdp_sbuf_printf(&b, "param %s shape ", p->name);
            for (int d = 0; d < p->ndim; d++)
                fsdp_sbuf_printf(&b, "%s%" PRId64, d ? "," : "", p->shape[d]);
            fsdp_sbuf_printf(&b, " offset %zu numel %zu", p->offset, p->numel);
            if (rows)
                fsdp_sbuf_printf(&b, " rows %zu at %zu", p->shard_rows, p->shard_at);
            fsdp_sbuf_printf(&b, "\n");
        }
    }
    fsdp_sbuf_printf(&b, "end\n");
    if (!b.oom) /* over every byte before it (manifest.h) */
        fsdp_sbuf_printf(&b, "checksum %016" PRIx64 "\n", (uint64_t)XXH64(b.p, b.n, 0));
    if (b.oom) {
        free(b.p);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing manifest '%s'", path);
    }
    fsdp_status st = fsdp_write_file_sync(path, b.p, b.n, "checkpoint manifest");
    free(b.p);
    return st;
}

