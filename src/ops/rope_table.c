/*
 * rope_table.c - rotary inverse frequencies from a model's rope config.
 *
 * The formulas follow transformers' modeling_rope_utils (the reference the
 * tests compare against): default theta^(-2i/hd); linear divides by factor;
 * llama3 keeps wavelengths below original_max_pos / high_freq_factor,
 * divides those above original_max_pos / low_freq_factor by factor, and
 * blends the two in between with
 *   s = (original_max_pos / wavelen - low) / (high - low),
 *   f = (1 - s) f / factor + s f.
 */
#include <math.h>
#include <string.h>

#include "ops/rope_table.h"

static const char *const rope_type_names[FSDP_ROPE_TYPE_COUNT] = {
    [FSDP_ROPE_DEFAULT] = "default",
    [FSDP_ROPE_LINEAR] = "linear",
    [FSDP_ROPE_LLAMA3] = "llama3",
};

fsdp_status fsdp_rope_type_parse(const char *name, fsdp_rope_type *out)
{
    for (int t = 0; t < FSDP_ROPE_TYPE_COUNT; t++) {
        if (name && strcmp(name, rope_type_names[t]) == 0) {
            *out = (fsdp_rope_type)t;
            return FSDP_STATUS_OK;
        }
    }
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                          "rope scaling type '%s' is not supported (supported: default, linear, "
                          "llama3)",
                          name ? name : "(null)");
}

const char *fsdp_rope_type_name(fsdp_rope_type type)
{
    return type >= 0 && type < FSDP_ROPE_TYPE_COUNT ? rope_type_names[type] : "unknown";
}

fsdp_status fsdp_rope_inv_freq(const fsdp_rope_spec *spec, int hd, float *inv_freq)
{
    if (hd <= 0 || hd % 2)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "rope: head_dim %d must be positive and even", hd);
    if (!(spec->theta > 0.0))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "rope: rope_theta %g must be positive",
                              spec->theta);
    if (spec->type < 0 || spec->type >= FSDP_ROPE_TYPE_COUNT)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "rope: unknown scaling type %d",
                              (int)spec->type);
    if (spec->type != FSDP_ROPE_DEFAULT && !(spec->factor > 0.0))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "rope: rope_scaling.factor %g must be positive (type %s)",
                              spec->factor, rope_type_names[spec->type]);
    if (spec->type == FSDP_ROPE_LLAMA3) {
        if (!(spec->low_freq_factor > 0.0) || !(spec->high_freq_factor > spec->low_freq_factor))
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "rope: llama3 scaling needs 0 < low_freq_factor (%g) < "
                                  "high_freq_factor (%g)",
                                  spec->low_freq_factor, spec->high_freq_factor);
        if (spec->original_max_pos <= 0)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "rope: llama3 scaling needs original_max_position_embeddings "
                                  "> 0 (got %d)",
                                  spec->original_max_pos);
    }
    /* transformers' steps, each rounded to fp32 as torch rounds them:
     * exponent 2i/hd, theta^exponent, its reciprocal; then the scaling. */
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    const float theta = (float)spec->theta, factor = (float)spec->factor;
    for (int i = 0; i < hd / 2; i++) {
        float e = (float)(2 * i) / (float)hd;
        float f = 1.0f / (float)pow((double)theta, (double)e);
        if (spec->type == FSDP_ROPE_LINEAR) {
            f = f / factor;
        } else if (spec->type == FSDP_ROPE_LLAMA3) {
            const double old = spec->original_max_pos;
            const double low_wavelen = old / spec->low_freq_factor;
            const double high_wavelen = old / spec->high_freq_factor;
            const float wavelen = (1.0f / f) * two_pi;
            if (wavelen > low_wavelen) {
                f = f / factor;
            } else if (!(wavelen < high_wavelen)) {
                float s = ((float)old / wavelen - (float)spec->low_freq_factor) /
                          (float)(spec->high_freq_factor - spec->low_freq_factor);
                f = ((1.0f - s) * f) / factor + s * f;
            }
        }
        inv_freq[i] = f;
    }
    return FSDP_STATUS_OK;
}
