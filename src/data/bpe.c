/*
 * bpe.c - the byte-level BPE model (bpe.h): vocabulary and merge tables,
 * the word encoder and its cache.
 *
 * Three open-addressing hash tables (power-of-two sizes, linear probing,
 * at most half full): vocabulary bytes -> id, (left, right) -> (rank,
 * merged), and the word cache bytes -> ids. Keys live in byte/int arenas
 * addressed by offset, so growing an arena never invalidates a slot.
 *
 * The merge loop follows Hugging Face's word.rs exactly, because ties and
 * stale candidates decide which ids come out: candidates are ordered by
 * (rank, position); a popped candidate is skipped when its left symbol is
 * gone, has no right neighbour, or the current pair no longer yields the
 * candidate's merged id.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "data/bpe.h"

#define CACHE_SLOTS (1u << 16)        /* words remembered (half of the slots) */
#define CACHE_MAX_WORD 256            /* longer words are not cached */
#define CACHE_MAX_ARENA (16u << 20)   /* bytes of cached keys and ids before a reset */

typedef struct tok_slot {
    uint64_t hash;
    uint32_t off, len;  /* key bytes in b->keys */
    int id;             /* -1: empty */
} tok_slot;

typedef struct pair_slot {
    uint64_t key;       /* left << 32 | right */
    uint32_t rank;
    int merged;         /* -1: empty */
} pair_slot;

typedef struct cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len;  /* in cache_keys */
    uint32_t ids_off, ids_n;    /* in cache_ids */
    bool used;
} cache_slot;

typedef struct sym {
    int id;
    int prev, next;     /* neighbours in the word, -1 at the ends */
    bool alive;         /* false once merged into its left neighbour */
} sym;

typedef struct cand {
    uint32_t rank;
    uint32_t pos;       /* the left symbol */
    int merged;
} cand;

struct fsdp_bpe {
    uint8_t *keys;      /* vocabulary bytes */
    size_t keys_n, keys_cap;
    tok_slot *toks;
    size_t toks_cap, n_toks;
    pair_slot *pairs;
    size_t pairs_cap, n_pairs;
    int byte_id[256];
    bool ignore_merges;
    /* cache */
    cache_slot *cache;
    size_t n_cache;
    uint8_t *cache_keys;
    size_t cache_keys_n, cache_keys_cap;
    int *cache_ids;
    size_t cache_ids_n, cache_ids_cap;
    /* scratch for one word */
    sym *syms;
    cand *heap;
    size_t scratch_cap;  /* syms: cap; heap: 3 * cap */
};

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0x243f6a8885a308d3ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = fsdp_rng_mix(h ^ v);
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, p, n);
    return fsdp_rng_mix(h ^ v);
}

/* Grow *buf (elements of `size` bytes) to hold at least `need`. */
static bool grow(void **buf, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    void *p = realloc(*buf, c * size);
    if (!p)
        return false;
    *buf = p;
    *cap = c;
    return true;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 64;
    while (c < n)
        c *= 2;
    return c;
}

/* ---- vocabulary ---------------------------------------------------------------- */

static fsdp_status toks_resize(fsdp_bpe *b, size_t cap)
{
    tok_slot *t = malloc(cap * sizeof *t);
    if (!t)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a vocabulary of %zu",
                              b->n_toks);
    for (size_t i = 0; i < cap; i++)
        t[i].id = -1;
    for (size_t i = 0; i < b->toks_cap; i++) {
        if (b->toks[i].id < 0)
            continue;
        size_t j = b->toks[i].hash & (cap - 1);
        while (t[j].id >= 0)
            j = (j + 1) & (cap - 1);
        t[j] = b->toks[i];
    }
    free(b->toks);
    b->toks = t;
    b->toks_cap = cap;
    return FSDP_STATUS_OK;
}

static fsdp_status pairs_resize(fsdp_bpe *b, size_t cap)
{
    pair_slot *t = malloc(cap * sizeof *t);
    if (!t)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for %zu merges", b->n_pairs);
    for (size_t i = 0; i < cap; i++)
        t[i].merged = -1;
    for (size_t i = 0; i < b->pairs_cap; i++) {
        if (b->pairs[i].merged < 0)
            continue;
        size_t j = fsdp_rng_mix(b->pairs[i].key) & (cap - 1);
        while (t[j].merged >= 0)
            j = (j + 1) & (cap - 1);
        t[j] = b->pairs[i];
    }
    free(b->pairs);
    b->pairs = t;
    b->pairs_cap = cap;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_bpe_init(fsdp_bpe **out, size_t n_tokens_hint, size_t n_merges_hint)
{
    *out = NULL;
    fsdp_bpe *b = calloc(1, sizeof *b);
    if (!b)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a tokenizer");
    for (int i = 0; i < 256; i++)
        b->byte_id[i] = -1;
    fsdp_status st = toks_resize(b, pow2_at_least(2 * n_tokens_hint + 2));
    if (st == FSDP_STATUS_OK)
        st = pairs_resize(b, pow2_at_least(2 * n_merges_hint + 2));
    if (st == FSDP_STATUS_OK && !(b->cache = calloc(CACHE_SLOTS, sizeof *b->cache)))
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the tokenizer's cache");
    return FSDP_OUT_OR_FREE(st, out, b, fsdp_bpe_free);
}

void fsdp_bpe_free(fsdp_bpe *b)
{
    if (!b)
        return;
    free(b->keys);
    free(b->toks);
    free(b->pairs);
    free(b->cache);
    free(b->cache_keys);
    free(b->cache_ids);
    free(b->syms);
    free(b->heap);
    free(b);
}

static tok_slot *tok_lookup(const fsdp_bpe *b, const uint8_t *s, size_t n, uint64_t h)
{
    size_t j = h & (b->toks_cap - 1);
    for (;; j = (j + 1) & (b->toks_cap - 1)) {
        tok_slot *t = &b->toks[j];
        if (t->id < 0 || (t->hash == h && t->len == n && memcmp(b->keys + t->off, s, n) == 0))
            return t;
    }
}

fsdp_status fsdp_bpe_add_token(fsdp_bpe *b, const uint8_t *bytes, size_t n, int id)
{
    if (n == 0 || n > UINT32_MAX || id < 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "a vocabulary entry is empty or too long");
    if (2 * (b->n_toks + 1) > b->toks_cap)
        FSDP_TRY(toks_resize(b, 2 * b->toks_cap));
    uint64_t h = hash_bytes(bytes, n);
    tok_slot *t = tok_lookup(b, bytes, n, h);
    if (t->id >= 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "ids %d and %d stand for the same bytes (%zu bytes)", t->id, id, n);
    if (b->keys_n + n > UINT32_MAX ||
        !grow((void **)&b->keys, &b->keys_cap, b->keys_n + n, 1))
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the vocabulary");
    memcpy(b->keys + b->keys_n, bytes, n);
    *t = (tok_slot){.hash = h, .off = (uint32_t)b->keys_n, .len = (uint32_t)n, .id = id};
    b->keys_n += n;
    b->n_toks++;
    if (n == 1)
        b->byte_id[bytes[0]] = id;
    return FSDP_STATUS_OK;
}

int fsdp_bpe_find(const fsdp_bpe *b, const uint8_t *bytes, size_t n)
{
    if (n == 0)
        return -1;
    return tok_lookup(b, bytes, n, hash_bytes(bytes, n))->id;
}

/* ---- merges -------------------------------------------------------------------- */

static pair_slot *pair_lookup(const fsdp_bpe *b, uint64_t key)
{
    size_t j = fsdp_rng_mix(key) & (b->pairs_cap - 1);
    for (;; j = (j + 1) & (b->pairs_cap - 1)) {
        pair_slot *p = &b->pairs[j];
        if (p->merged < 0 || p->key == key)
            return p;
    }
}

static uint64_t pair_key(int left, int right)
{
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

fsdp_status fsdp_bpe_add_merge(fsdp_bpe *b, int left, int right, int merged, uint32_t rank)
{
    if (2 * (b->n_pairs + 1) > b->pairs_cap)
        FSDP_TRY(pairs_resize(b, 2 * b->pairs_cap));
    uint64_t key = pair_key(left, right);
    pair_slot *p = pair_lookup(b, key);
    if (p->merged < 0)
        b->n_pairs++;
    *p = (pair_slot){.key = key, .rank = rank, .merged = merged};
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_bpe_finish(fsdp_bpe *b, bool ignore_merges)
{
    for (int i = 0; i < 256; i++)
        if (b->byte_id[i] < 0)
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "byte 0x%02x has no token of its own; a byte-level BPE "
                                  "vocabulary holds all 256 bytes", i);
    b->ignore_merges = ignore_merges;
    return FSDP_STATUS_OK;
}

/* ---- the merge loop ------------------------------------------------------------ */

static bool cand_less(const cand *x, const cand *y)
{
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &h[parent]))
            break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const cand *best = &last;
        if (l < *n && cand_less(&h[l], best)) {
            m = l;
            best = &h[l];
        }
        if (l + 1 < *n && cand_less(&h[l + 1], best))
            m = l + 1;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* Push the merge of s[pos] with its right neighbour, if one applies. */
static void push_pair(const fsdp_bpe *b, cand *heap, size_t *n_heap, const sym *s, int pos)
{
    if (pos < 0 || s[pos].next < 0)
        return;
    const pair_slot *p = pair_lookup(b, pair_key(s[pos].id, s[s[pos].next].id));
    if (p->merged >= 0)
        heap_push(heap, n_heap, (cand){.rank = p->rank, .pos = (uint32_t)pos, .merged = p->merged});
}

static fsdp_status merge_word(fsdp_bpe *b, const uint8_t *w, size_t n, fsdp_ids *out)
{
    if (n > b->scratch_cap) {
        size_t cap = pow2_at_least(n);
        sym *s = realloc(b->syms, cap * sizeof *s);
        if (s)
            b->syms = s;
        cand *h = s ? realloc(b->heap, 3 * cap * sizeof *h) : NULL;
        if (!h)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory encoding a %zu-byte word",
                                  n);
        b->heap = h;
        b->scratch_cap = cap;
    }
    sym *s = b->syms;
    cand *heap = b->heap;
    size_t n_heap = 0;
    for (size_t i = 0; i < n; i++)
        s[i] = (sym){.id = b->byte_id[w[i]], .prev = (int)i - 1,
                     .next = i + 1 < n ? (int)i + 1 : -1, .alive = true};
    for (size_t i = 0; i + 1 < n; i++)
        push_pair(b, heap, &n_heap, s, (int)i);
    /* each merge removes a symbol and pushes at most two candidates: the
     * heap never holds more than 3n entries */
    while (n_heap > 0) {
        cand c = heap_pop(heap, &n_heap);
        sym *left = &s[c.pos];
        if (!left->alive || left->next < 0)
            continue;
        sym *right = &s[left->next];
        const pair_slot *p = pair_lookup(b, pair_key(left->id, right->id));
        if (p->merged != c.merged)
            continue; /* stale: one side changed since this was pushed */
        left->id = c.merged;
        right->alive = false;
        left->next = right->next;
        if (right->next >= 0)
            s[right->next].prev = (int)c.pos;
        push_pair(b, heap, &n_heap, s, left->prev);
        push_pair(b, heap, &n_heap, s, (int)c.pos);
    }
    size_t k = 0;
    for (int i = 0; i >= 0; i = s[i].next)
        k++;
    FSDP_TRY(fsdp_ids_reserve(out, k));
    for (int i = 0; i >= 0; i = s[i].next)
        out->p[out->n++] = s[i].id;
    return FSDP_STATUS_OK;
}

/* ---- the cache ------------------------------------------------------------------ */

static cache_slot *cache_lookup(const fsdp_bpe *b, const uint8_t *w, size_t n, uint64_t h)
{
    size_t j = h & (CACHE_SLOTS - 1);
    for (;; j = (j + 1) & (CACHE_SLOTS - 1)) {
        cache_slot *c = &b->cache[j];
        if (!c->used || (c->hash == h && c->key_len == n &&
                         memcmp(b->cache_keys + c->key_off, w, n) == 0))
            return c;
    }
}

static void cache_reset(fsdp_bpe *b)
{
    memset(b->cache, 0, CACHE_SLOTS * sizeof *b->cache);
    b->n_cache = 0;
    b->cache_keys_n = 0;
    b->cache_ids_n = 0;
}

/* Remember w -> ids (best effort: a full cache is emptied first; an
 * allocation failure just skips caching). */
static void cache_put(fsdp_bpe *b, cache_slot *c, uint64_t h, const uint8_t *w, size_t n,
                      const int *ids, size_t k)
{
    if (2 * (b->n_cache + 1) > CACHE_SLOTS || b->cache_keys_n + n > CACHE_MAX_ARENA ||
        b->cache_ids_n + k > CACHE_MAX_ARENA / sizeof(int)) {
        cache_reset(b);
        c = cache_lookup(b, w, n, h);
    }
    if (!grow((void **)&b->cache_keys, &b->cache_keys_cap, b->cache_keys_n + n, 1) ||
        !grow((void **)&b->cache_ids, &b->cache_ids_cap, b->cache_ids_n + k, sizeof(int)))
        return;
    memcpy(b->cache_keys + b->cache_keys_n, w, n);
    memcpy(b->cache_ids + b->cache_ids_n, ids, k * sizeof *ids);
    *c = (cache_slot){.hash = h, .key_off = (uint32_t)b->cache_keys_n, .key_len = (uint32_t)n,
                      .ids_off = (uint32_t)b->cache_ids_n, .ids_n = (uint32_t)k, .used = true};
    b->cache_keys_n += n;
    b->cache_ids_n += k;
    b->n_cache++;
}

fsdp_status fsdp_bpe_encode_word(fsdp_bpe *b, const uint8_t *w, size_t n, fsdp_ids *out)
{
    if (n == 0)
        return FSDP_STATUS_OK;
    if (n == 1) {
        FSDP_TRY(fsdp_ids_reserve(out, 1));
        out->p[out->n++] = b->byte_id[w[0]];
        return FSDP_STATUS_OK;
    }
    uint64_t h = hash_bytes(w, n);
    if (b->ignore_merges) {
        int id = tok_lookup(b, w, n, h)->id;
        if (id >= 0) {
            FSDP_TRY(fsdp_ids_reserve(out, 1));
            out->p[out->n++] = id;
            return FSDP_STATUS_OK;
        }
    }
    if (n > CACHE_MAX_WORD)
        return merge_word(b, w, n, out);
    cache_slot *c = cache_lookup(b, w, n, h);
    if (c->used) {
        FSDP_TRY(fsdp_ids_reserve(out, c->ids_n));
        memcpy(out->p + out->n, b->cache_ids + c->ids_off, c->ids_n * sizeof(int));
        out->n += c->ids_n;
        return FSDP_STATUS_OK;
    }
    size_t first = out->n;
    FSDP_TRY(merge_word(b, w, n, out));
    cache_put(b, c, h, w, n, out->p + first, out->n - first);
    return FSDP_STATUS_OK;
}
