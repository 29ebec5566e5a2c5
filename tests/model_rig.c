/*
 * model_rig.c - one rank driving a model through its interface
 * (model_rig.h).
 */
#include "model_rig.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/error.h"
#include "models/registry.h"

/* rig_init on a zeroed rig (r->own may hold the model already). */
static void rig_setup(rig *r, fsdp_backend be, const fsdp_model *m, fsdp_dtype dt, int B, int T,
                      bool training)
{
    r->m = m;
    r->B = B;
    r->T = T;
    ck_assert_int_eq(fsdp_device_init(&r->dev, be, NULL, 0, 0, 0), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ops_init(&r->ctx, &r->dev, dt), FSDP_STATUS_OK);
    r->params = calloc((size_t)m->n_units, sizeof *r->params);
    r->grads = calloc((size_t)m->n_units, sizeof *r->grads);
    ck_assert(r->params && r->grads);
    for (int u = 0; u < m->n_units; u++) {
        size_t n = m->units[u].numel;
        ck_assert_int_eq(fsdp_device_alloc(&r->dev, n * fsdp_dtype_size(dt), FSDP_MEM_GATHER,
                                           "test params", &r->params[u]),
                         FSDP_STATUS_OK);
        if (training)
            ck_assert_int_eq(fsdp_device_alloc(&r->dev, n * sizeof(float), FSDP_MEM_GRAD,
                                               "test grads", (void **)&r->grads[u]),
                             FSDP_STATUS_OK);
    }
    ck_assert_msg(m->iface->state_init(m, &r->ctx, B, T, training, &r->state) == FSDP_STATUS_OK,
                  "%s", fsdp_error_msg());
}

void rig_init(rig *r, fsdp_backend be, const fsdp_model *m, fsdp_dtype dt, int B, int T,
              bool training)
{
    memset(r, 0, sizeof *r);
    rig_setup(r, be, m, dt, B, T, training);
}

void rig_init_gpt2(rig *r, fsdp_backend be, const fsdp_gpt2_config *cfg, fsdp_dtype dt, int B,
                   int T, bool training)
{
    memset(r, 0, sizeof *r);
    ck_assert_int_eq(fsdp_gpt2_init(&r->own, cfg), FSDP_STATUS_OK);
    rig_setup(r, be, &r->own, dt, B, T, training);
}

void rig_free(rig *r)
{
    const fsdp_model *m = r->m;
    m->iface->state_free(m, &r->ctx, r->state);
    for (int u = 0; u < m->n_units; u++) {
        fsdp_device_free(&r->dev, r->params[u]);
        fsdp_device_free(&r->dev, r->grads[u]);
    }
    ck_assert_int_eq(r->dev.mem.in_use_bytes, 0);
    ck_assert_int_eq(r->dev.host.in_use_bytes, 0);
    free(r->params);
    free(r->grads);
    if (m == &r->own)
        fsdp_model_free(&r->own);
    fsdp_ops_fini(&r->ctx);
    fsdp_device_fini(&r->dev);
}

void rig_zero_grads(rig *r)
{
    for (int u = 0; u < r->m->n_units; u++)
        ck_assert_int_eq(fsdp_device_memset(&r->dev, r->grads[u], 0,
                                            r->m->units[u].numel * sizeof(float), NULL),
                         FSDP_STATUS_OK);
}

float rig_step(rig *r, const int *tokens, const int *targets, bool train, float dloss)
{
    const fsdp_model *m = r->m;
    const struct fsdp_model_i *mi = m->iface;
    size_t nb = (size_t)r->B * r->T * sizeof(int);
    ck_assert_int_eq(fsdp_device_memcpy(&r->dev, mi->state_tokens(r->state), tokens, nb, NULL),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_memcpy(&r->dev, mi->state_targets(r->state), targets, nb, NULL),
                     FSDP_STATUS_OK);
    float loss = -1.0f;
    ck_assert_int_eq(mi->root_forward(m, &r->ctx, r->state, r->params[0]), FSDP_STATUS_OK);
    for (int u = 1; u < m->n_units; u++)
        ck_assert_int_eq(mi->unit_forward(m, &r->ctx, r->state, u, r->params[u]),
                         FSDP_STATUS_OK);
    ck_assert_int_eq(mi->head_forward_backward(m, &r->ctx, r->state, r->params[0],
                                               train ? r->grads[0] : NULL, dloss, &loss),
                     FSDP_STATUS_OK);
    if (!train)
        return loss;
    for (int u = m->n_units - 1; u >= 1; u--)
        ck_assert_int_eq(mi->unit_backward(m, &r->ctx, r->state, u, r->params[u], r->grads[u]),
                         FSDP_STATUS_OK);
    ck_assert_int_eq(mi->root_backward(m, &r->ctx, r->state, r->params[0], r->grads[0]),
                     FSDP_STATUS_OK);
    /* the gradients are read from the host next (async cpu streams queue the ops) */
    ck_assert_int_eq(fsdp_device_stream_sync(&r->dev, r->ctx.stream), FSDP_STATUS_OK);
    return loss;
}

void rig_put(rig *r, int unit, size_t offset, const float *src, size_t n)
{
    if (r->ctx.dt == FSDP_DTYPE_F32) {
        memcpy((float *)r->params[unit] + offset, src, n * sizeof(float));
    } else {
        fsdp_bf16 *p = (fsdp_bf16 *)r->params[unit] + offset;
        for (size_t i = 0; i < n; i++)
            p[i] = fsdp_f32_to_bf16(src[i]);
    }
}

void rig_put_units(rig *r, float *const *units)
{
    for (int u = 0; u < r->m->n_units; u++)
        rig_put(r, u, 0, units[u], r->m->units[u].numel);
}

void expect_specs_rejected(const text_case *bad, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fsdp_model m;
        fsdp_error_clear();
        fsdp_status st = fsdp_model_from_spec(bad[i].in, &m);
        ck_assert_msg(st == FSDP_STATUS_INVALID_ARG, "'%s' was accepted", bad[i].in);
        ck_assert_msg(strstr(fsdp_error_msg(), bad[i].want), "'%s': message '%s' lacks '%s'",
                      bad[i].in, fsdp_error_msg(), bad[i].want);
        ck_assert_ptr_null(m.units);
    }
}

float **units_alloc(const fsdp_model *m)
{
    float **u = calloc((size_t)m->n_units, sizeof *u);
    ck_assert_ptr_nonnull(u);
    for (int i = 0; i < m->n_units; i++) {
        u[i] = calloc(m->units[i].numel, sizeof **u);
        ck_assert_ptr_nonnull(u[i]);
    }
    return u;
}

float **units_init(const fsdp_model *m, uint64_t seed)
{
    float **u = units_alloc(m);
    for (int i = 0; i < m->n_units; i++)
        fsdp_model_init_range(m, i, 0, m->units[i].numel, seed, u[i]);
    return u;
}

void units_free(const fsdp_model *m, float **units)
{
    for (int i = 0; i < m->n_units; i++)
        free(units[i]);
    free(units);
}

const struct fsdp_model_i *model_drop_recompute(fsdp_model *m, struct fsdp_model_i *without)
{
    const struct fsdp_model_i *own = m->iface;
    *without = *own;
    without->state_init_recompute = NULL;
    without->unit_recompute = NULL;
    without->recompute_flops_per_token = NULL;
    m->iface = without;
    return own;
}
