/*
 * norm_cover.c - covers of the norm blocks' global tree (norm_cover.h).
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/norm_cover.h"

/* The cover of [a, b) in the tree over [lo, hi): each maximal node inside
 * it, left to right. blocks: the interval's first block (NULL: count only,
 * into *n). */
static void cover(size_t a, size_t b, size_t lo, size_t hi, const float *blocks, float *out,
                  size_t *n)
{
    if (hi <= a || lo >= b)
        return;
    if (lo >= a && hi <= b) {
        if (blocks)
            out[*n] = fsdp_tree_sum(blocks + (lo - a), (int)(hi - lo));
        (*n)++;
        return;
    }
    size_t mid = lo + (hi - lo) / 2;
    cover(a, b, lo, mid, blocks, out, n);
    cover(a, b, mid, hi, blocks, out, n);
}

fsdp_status fsdp_norm_cover_init(fsdp_norm_cover *nc, const fsdp_shardmap *sm)
{
    memset(nc, 0, sizeof *nc);
    int U = sm->n_units, K = sm->shard_ranks;
    size_t cap = 1;
    for (int u = 0; u < U; u++)
        cap += (size_t)sm->units[u].seg_first[FSDP_SEG_TRAIN + 1] * (size_t)K;
    nc->iv_lo = calloc(cap, sizeof *nc->iv_lo);
    nc->iv_hi = calloc(cap, sizeof *nc->iv_hi);
    nc->iv_local = calloc(cap, sizeof *nc->iv_local);
    nc->iv_owner = calloc(cap, sizeof *nc->iv_owner);
    if (!nc->iv_lo || !nc->iv_hi || !nc->iv_local || !nc->iv_owner) {
        fsdp_norm_cover_free(nc);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the gradient norm's "
                              "partial sums");
    }
    nc->n_owners = K;
    size_t base = 0, local_base = 0;
    for (int u = 0; u < U; u++) {
        const fsdp_shard_unit *su = &sm->units[u];
        for (int i = 0; i < su->seg_first[FSDP_SEG_TRAIN + 1]; i++) {
            const fsdp_shard_param *sp = &su->params[i];
            /* owner k holds blocks [k * per, (k+1) * per) of the parameter's real ones */
            size_t nb = (sp->spec->numel + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
            size_t per = fsdp_shard_param_blocks(sp);
            for (int k = 0; k < K; k++) {
                size_t lo = (size_t)k * per, hi = lo + per < nb ? lo + per : nb;
                if (lo >= hi)
                    continue;
                nc->iv_lo[nc->n_iv] = base + lo;
                nc->iv_hi[nc->n_iv] = base + hi;
                nc->iv_owner[nc->n_iv] = k;
                nc->iv_local[nc->n_iv] = local_base + sp->block_off;
                nc->n_iv++;
            }
            base += nb;
        }
        local_base += su->n_blocks;
    }
    nc->n_blocks = base;
    /* the longest record: count each owner's cover nodes */
    size_t *count = calloc((size_t)K, sizeof *count);
    if (!count) {
        fsdp_norm_cover_free(nc);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the gradient norm's "
                              "partial sums");
    }
    for (int i = 0; i < nc->n_iv; i++)
        cover(nc->iv_lo[i], nc->iv_hi[i], 0, nc->n_blocks, NULL, NULL, &count[nc->iv_owner[i]]);
    for (int k = 0; k < K; k++)
        if (count[k] > nc->record_len)
            nc->record_len = count[k];
    free(count);
    if (nc->record_len == 0)
        nc->record_len = 1;
    return FSDP_STATUS_OK;
}

void fsdp_norm_cover_free(fsdp_norm_cover *nc)
{
    free(nc->iv_lo);
    free(nc->iv_hi);
    free(nc->iv_local);
    free(nc->iv_owner);
    memset(nc, 0, sizeof *nc);
}

void fsdp_norm_cover_record(const fsdp_norm_cover *nc, int owner, const float *blocks, float *rec)
{
    size_t n = 0;
    for (int i = 0; i < nc->n_iv; i++)
        if (nc->iv_owner[i] == owner && blocks)
            cover(nc->iv_lo[i], nc->iv_hi[i], 0, nc->n_blocks, blocks + nc->iv_local[i], rec,
                  &n);
    for (; n < nc->record_len; n++)
        rec[n] = 0.0f;
}

struct eval {
    const fsdp_norm_cover *nc;
    const float *records;
    size_t stride;
    size_t *cursor; /* (n_owners,) next value of each owner's record */
};

/* The interval holding block x (the last one starting at or before it). */
static int interval_of(const fsdp_norm_cover *nc, size_t x)
{
    int lo = 0, hi = nc->n_iv - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (nc->iv_lo[mid] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static float eval(struct eval *ev, size_t lo, size_t hi)
{
    const fsdp_norm_cover *nc = ev->nc;
    int i = interval_of(nc, lo);
    if (hi <= nc->iv_hi[i]) { /* a cover node: the owner's next value */
        int k = nc->iv_owner[i];
        return ev->records[(size_t)k * ev->stride + ev->cursor[k]++];
    }
    size_t mid = lo + (hi - lo) / 2;
    float a = eval(ev, lo, mid);
    float b = eval(ev, mid, hi);
    return a + b;
}

float fsdp_norm_cover_total(const fsdp_norm_cover *nc, const float *records, size_t stride)
{
    if (nc->n_blocks == 0)
        return 0.0f;
    size_t cursor[FSDP_MAX_RANKS] = {0};
    struct eval ev = {nc, records, stride, cursor};
    return eval(&ev, 0, nc->n_blocks);
}
