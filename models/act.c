/*
 * act.c - the step plumbing every model family shares (contract in act.h).
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/tree_sum.h"
#include "device/device.h"
#include "models/act.h"
#include "models/family.h"

fsdp_status fsdp_act_set_init(fsdp_act_set *a, const char *family, int B, int T, int cap)
{
    *a = (fsdp_act_set){.family = family, .B = B, .T = T, .cap = cap};
    a->allocs = calloc((size_t)cap, sizeof *a->allocs);
    if (!a->allocs)
        return fsdp_error_set(FSDP_STATUS_OOM, "host allocation of a %s state failed", family);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_act_alloc(fsdp_op_ctx *ctx, fsdp_act_set *a, size_t bytes, const char *what,
                           int layer, void *out)
{
    char desc[112];
    if (layer >= 0)
        snprintf(desc, sizeof desc, "activations '%s' of layer %d (B=%d, T=%d)", what, layer,
                 a->B, a->T);
    else if (layer == -2)
        snprintf(desc, sizeof desc, "activations '%s', one copy for all layers (B=%d, T=%d)",
                 what, a->B, a->T);
    else
        snprintf(desc, sizeof desc, "activations '%s' (B=%d, T=%d)", what, a->B, a->T);
    FSDP_ASSERT(a->n < a->cap);
    void *p = NULL;
    FSDP_TRY(fsdp_device_alloc(ctx->dev, bytes, FSDP_MEM_ACT, desc, &p));
    a->allocs[a->n++] = p;
    *(void **)out = p;
    return FSDP_STATUS_OK;
}

/* The buffer pointer of field f in layer l's struct. */
static void **field_slot(const fsdp_act_layout *lay, void *layers, int l, int f)
{
    return (void **)((char *)layers + (size_t)l * lay->layer_bytes + lay->fields[f].offset);
}

fsdp_status fsdp_act_layers_alloc(const fsdp_model *m, fsdp_op_ctx *ctx, fsdp_act_set *a,
                                  const fsdp_act_layout *lay, const void *state, void *layers,
                                  bool training, fsdp_recompute mode)
{
    const size_t dts = fsdp_dtype_size(ctx->dt);
    for (int l = 0; l < m->n_layer; l++)
        for (int f = 0; f < lay->n_fields; f++) {
            void **dst = field_slot(lay, layers, l, f);
            bool kept = fsdp_act_kept(lay, f, training, mode);
            if (l > 0 && !kept) {
                *dst = *field_slot(lay, layers, 0, f);
                continue;
            }
            size_t bytes = lay->field_bytes(m, state, lay->fields[f].width, dts);
            FSDP_TRY(fsdp_act_alloc(ctx, a, bytes, lay->fields[f].name, kept ? l : -2, dst));
        }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_act_host_losses(fsdp_op_ctx *ctx, fsdp_act_set *a)
{
    char desc[96];
    snprintf(desc, sizeof desc, "host copy of the losses (B=%d, T=%d)", a->B, a->T);
    return fsdp_device_host_alloc(ctx->dev, (size_t)a->B * a->T * sizeof(float), FSDP_MEM_ACT,
                                  desc, (void **)&a->host_losses);
}

void fsdp_act_set_free(fsdp_op_ctx *ctx, fsdp_act_set *a)
{
    for (int i = a->n - 1; i >= 0; i--)
        fsdp_device_free(ctx->dev, a->allocs[i]);
    if (a->host_losses)
        fsdp_device_host_free(ctx->dev, a->host_losses);
    free(a->allocs);
    *a = (fsdp_act_set){0};
}

/* The family's name in messages: "GPT-2". */
static const char *title(const fsdp_model *m) { return m->family->title; }

fsdp_status fsdp_act_ops_status(fsdp_op_ctx *ctx, const fsdp_model *m, const char *what,
                                int unit)
{
    if (!ctx->iface || !ctx->iface->sync_error)
        return FSDP_STATUS_OK;
    fsdp_status st = ctx->iface->sync_error(ctx);
    if (st != FSDP_STATUS_OK)
        fsdp_error_prefix("%s %s of unit '%s': ", title(m), what, m->units[unit].name);
    return st;
}

fsdp_status fsdp_act_read_loss(fsdp_op_ctx *ctx, const fsdp_act_set *a, const fsdp_model *m,
                               const float *losses, int N, float *loss)
{
    FSDP_ASSERT(N <= a->B * a->T);
    FSDP_TRY(fsdp_device_memcpy(ctx->dev, a->host_losses, losses, (size_t)N * sizeof(float),
                                ctx->stream));
    FSDP_TRY(fsdp_device_stream_sync(ctx->dev, ctx->stream));
    FSDP_TRY(fsdp_act_ops_status(ctx, m, "head forward", 0));
    if (loss)
        *loss = fsdp_device_computes(ctx->dev) ? fsdp_tree_sum(a->host_losses, N) / (float)N : 0.0f;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_act_check_batch(const fsdp_model *m, int B, int T, bool fits,
                                 fsdp_recompute mode)
{
    const char *family = title(m);
    const int max_seq_len = m->max_seq_len;
    if (B < 1 || T < 1 || T > max_seq_len)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s micro-batch B=%d, T=%d is invalid; need B >= 1 and "
                              "1 <= T <= context (%d)",
                              family, B, T, max_seq_len);
    if (!fits)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s micro-batch B=%d, T=%d is too large for this model; "
                              "reduce --batch or --seq",
                              family, B, T);
    if ((int)mode < 0 || mode >= FSDP_RECOMPUTE_COUNT)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s: unknown recompute mode %d", family,
                              (int)mode);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_act_check_state(const fsdp_model *m, const void *state, bool grads,
                                 const char *what)
{
    if (!state)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s %s: no state (call state_init)",
                              title(m), what);
    if (grads && !((const fsdp_act_state *)state)->training)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s %s: gradients requested from a forward-only state "
                              "(state_init with training=true)",
                              title(m), what);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_act_check_unit(const fsdp_model *m, const void *state, int unit,
                                const char *what)
{
    FSDP_TRY(fsdp_act_check_state(m, state, false, what));
    if (unit < 1 || unit >= m->n_units)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s %s: unit %d is not a layer unit (layers are units 1..%d)",
                              title(m), what, unit, m->n_units - 1);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_act_check_backward(const fsdp_model *m, const void *state, int unit)
{
    FSDP_TRY(fsdp_act_check_unit(m, state, unit, "unit_backward"));
    if (!((const fsdp_act_state *)state)->training)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s unit_backward: the state is forward-only (state_init with "
                              "training=true)",
                              title(m));
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_act_zero(fsdp_op_ctx *ctx, float *p, size_t n)
{
    return fsdp_device_memset(ctx->dev, p, 0, n * sizeof(float), ctx->stream);
}

fsdp_status fsdp_act_state_new(const fsdp_model *m, size_t state_bytes, size_t layer_bytes,
                               int B, int T, bool training, fsdp_recompute mode, int cap,
                               void **out)
{
    const char *family = title(m);
    *out = NULL;
    fsdp_act_state *s = calloc(1, state_bytes);
    if (!s)
        return fsdp_error_set(FSDP_STATUS_OOM, "host allocation of a %s state failed", family);
    s->B = B;
    s->T = T;
    s->training = training;
    s->mode = training ? mode : FSDP_RECOMPUTE_NONE;
    fsdp_status st = fsdp_act_set_init(&s->act, family, B, T, cap);
    if (st != FSDP_STATUS_OK)
        return fsdp_act_state_fail(m, NULL, s, st);
    s->layers = calloc((size_t)m->n_layer, layer_bytes);
    if (!s->layers)
        return fsdp_act_state_fail(
            m, NULL, s,
            fsdp_error_set(FSDP_STATUS_OOM, "host allocation of a %s state failed", family));
    *out = s;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_act_state_alloc_io(fsdp_op_ctx *ctx, fsdp_act_state *s)
{
    const size_t N = (size_t)s->B * s->T;
    FSDP_TRY(fsdp_act_alloc(ctx, &s->act, N * sizeof(int), "tokens", -1, &s->tokens));
    return fsdp_act_alloc(ctx, &s->act, N * sizeof(int), "targets", -1, &s->targets);
}

fsdp_status fsdp_act_state_alloc_head(fsdp_op_ctx *ctx, fsdp_act_state *s, int Vp)
{
    const size_t N = (size_t)s->B * s->T, dts = fsdp_dtype_size(ctx->dt), f4 = sizeof(float);
    FSDP_TRY(fsdp_act_alloc(ctx, &s->act, N * Vp * dts, "logits", -1, &s->logits));
    FSDP_TRY(fsdp_act_alloc(ctx, &s->act, N * f4, "losses", -1, &s->losses));
    FSDP_TRY(fsdp_act_host_losses(ctx, &s->act));
    if (!s->training)
        return FSDP_STATUS_OK;
    if (ctx->dt == FSDP_DTYPE_F32) {
        s->dlogits = (float *)s->logits; /* xent writes dlogits in place */
        return FSDP_STATUS_OK;
    }
    return fsdp_act_alloc(ctx, &s->act, N * Vp * f4, "dlogits", -1, &s->dlogits);
}

fsdp_status fsdp_act_state_fail(const fsdp_model *m, fsdp_op_ctx *ctx, void *s, fsdp_status st)
{
    fsdp_act_state *base = s;
    fsdp_error_prefix("%s '%s' activations", base->act.family, m->name);
    fsdp_act_state_free(m, ctx, s);
    return st;
}

void fsdp_act_state_free(const fsdp_model *m, fsdp_op_ctx *ctx, void *state)
{
    (void)m;
    fsdp_act_state *s = state;
    if (!s)
        return;
    fsdp_act_set_free(ctx, &s->act);
    free(s->layers);
    free(s);
}

int *fsdp_act_state_tokens(void *state) { return ((fsdp_act_state *)state)->tokens; }
int *fsdp_act_state_targets(void *state) { return ((fsdp_act_state *)state)->targets; }
const void *fsdp_act_state_logits(void *state) { return ((fsdp_act_state *)state)->logits; }
void fsdp_act_state_positions(void *state, const int *pos) { ((fsdp_act_state *)state)->pos = pos; }

void fsdp_act_state_len(void *state, int T)
{
    fsdp_act_state *s = state;
    FSDP_ASSERT(T >= 1 && T <= s->act.T);
    s->T = T;
}

fsdp_status fsdp_act_state_loss(fsdp_op_ctx *ctx, const fsdp_model *m, fsdp_act_state *s, int V,
                                int Vp, float dloss, bool grads, float *loss)
{
    const int N = s->B * s->T;
    FSDP_OP(ctx, xent_fwd_bwd, s->losses, grads ? s->dlogits : NULL, s->logits, s->targets, N, V,
            Vp, dloss / (float)N);
    /* mean loss on the host, summed in the fixed tree order */
    return fsdp_act_read_loss(ctx, &s->act, m, s->losses, N, loss);
}

/* ---- the shared slots of a family's model table ---------------------------- */

static const fsdp_act_model_i *act_iface(const fsdp_model *m)
{
    return (const fsdp_act_model_i *)m->iface;
}

fsdp_status fsdp_act_state_init(const fsdp_model *m, fsdp_op_ctx *ctx, int B, int T,
                                bool training, void **state)
{
    return act_iface(m)->state_alloc(m, ctx, B, T, training, FSDP_RECOMPUTE_NONE, state);
}

fsdp_status fsdp_act_state_init_recompute(const fsdp_model *m, fsdp_op_ctx *ctx, int B, int T,
                                          fsdp_recompute mode, void **state)
{
    return act_iface(m)->state_alloc(m, ctx, B, T, true, mode, state);
}

fsdp_status fsdp_act_unit_forward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                  const void *params)
{
    FSDP_TRY(fsdp_act_check_unit(m, state, unit, "unit_forward"));
    return act_iface(m)->layer_forward(m, ctx, state, unit, params, false);
}

fsdp_status fsdp_act_unit_recompute(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                    const void *params)
{
    FSDP_TRY(fsdp_act_check_unit(m, state, unit, "unit_recompute"));
    if (!((fsdp_act_state *)state)->training)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s unit_recompute: the state is forward-only", title(m));
    return act_iface(m)->layer_forward(m, ctx, state, unit, params, true);
}
