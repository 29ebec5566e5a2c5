/*
 * names.c - lookups over name tables, and the dtype table (the public
 * fsdp_dtype_name() reads it).
 */
#include <string.h>

#include "core/names.h"

static bool allowed(unsigned allow, int value)
{
    return !allow || (value >= 0 && value < 32 && (allow & FSDP_NAME_BIT(value)));
}

const fsdp_name *fsdp_names_find(const fsdp_name_table *t, const char *s)
{
    for (int i = 0; s && i < t->n; i++)
        if (!strcmp(t->v[i].name, s))
            return &t->v[i];
    return NULL;
}

const fsdp_name *fsdp_names_of(const fsdp_name_table *t, int v)
{
    for (int i = 0; i < t->n; i++)
        if (t->v[i].value == v)
            return &t->v[i];
    return NULL;
}

const char *fsdp_names_name(const fsdp_name_table *t, int v)
{
    const fsdp_name *e = fsdp_names_of(t, v);
    return e ? e->name : "?";
}

char *fsdp_names_join(const fsdp_name_table *t, unsigned allow, const char *sep,
                      const char *last_sep, char *buf, size_t n)
{
    int n_allowed = 0;
    for (int i = 0; i < t->n; i++)
        n_allowed += allowed(allow, t->v[i].value);
    size_t len = 0;
    int k = 0;
    if (n)
        buf[0] = '\0';
    for (int i = 0; i < t->n && len < n; i++) {
        if (!allowed(allow, t->v[i].value))
            continue;
        const char *s = k == 0 ? "" : k == n_allowed - 1 ? last_sep : sep;
        int w = snprintf(buf + len, n - len, "%s%s", s, t->v[i].name);
        len += w > 0 ? (size_t)w : 0;
        k++;
    }
    return buf;
}

fsdp_status fsdp_names_parse(const fsdp_name_table *t, unsigned allow, const char *s, int *out)
{
    const fsdp_name *e = fsdp_names_find(t, s);
    if (e && allowed(allow, e->value)) {
        *out = e->value;
        return FSDP_STATUS_OK;
    }
    char list[256];
    fsdp_names_join(t, allow, ", ", " or ", list, sizeof list);
    if (e) /* a name of the table that this caller does not accept */
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "'%s' is not accepted here (expected %s)",
                              e->name, list);
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown value '%.64s' (expected %s)",
                          s ? s : "", list);
}

static const fsdp_name dtype_names[] = {
    {"fp32", FSDP_DTYPE_F32, "32-bit IEEE float"},
    {"bf16", FSDP_DTYPE_BF16, "bfloat16: fp32's exponent range, 8 significant bits, rounded to nearest even"},
};
const fsdp_name_table fsdp_dtype_names = FSDP_NAME_TABLE(dtype_names);

const char *fsdp_dtype_name(fsdp_dtype dt)
{
    const fsdp_name *e = fsdp_names_of(&fsdp_dtype_names, (int)dt);
    return e ? e->name : "unknown";
}
