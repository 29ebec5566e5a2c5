/* lora.c - placeholder on main until the lora-model branch lands: --freeze only. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/lora.h"

double fsdp_lora_scale(const fsdp_lora_config *c)
{
    return c->rslora ? c->alpha / sqrt((double)c->r) : c->alpha / c->r;
}

fsdp_status fsdp_lora_config_check(const fsdp_lora_config *c)
{
    (void)c;
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "LoRA is not built yet");
}

fsdp_status fsdp_model_add_lora(fsdp_model *m, const fsdp_lora_config *c)
{
    (void)m;
    return fsdp_lora_config_check(c);
}

static bool glob(const char *p, const char *s)
{
    if (!*p)
        return !*s;
    if (*p == '*')
        return glob(p + 1, s) || (*s && glob(p, s + 1));
    return *s == *p && glob(p + 1, s + 1);
}

fsdp_status fsdp_model_freeze(fsdp_model *m, const char *patterns)
{
    char buf[256], *save = NULL;
    snprintf(buf, sizeof buf, "%s", patterns);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int hits = 0;
        for (int u = 0; u < m->n_units; u++)
            for (int i = 0; i < m->units[u].n_params; i++)
                if (glob(tok, m->units[u].params[i].name)) {
                    m->units[u].params[i].frozen = true;
                    hits++;
                }
        if (!hits)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--freeze '%s' matches no parameter",
                                  tok);
    }
    snprintf(m->freeze, sizeof m->freeze, "%s", patterns);
    return fsdp_model_relayout(m);
}

bool fsdp_lora_is_adapter(const char *name)
{
    size_t n = strlen(name);
    return (n > 14 && !strcmp(name + n - 14, ".lora_A.weight")) ||
           (n > 14 && !strcmp(name + n - 14, ".lora_B.weight"));
}
