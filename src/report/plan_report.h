/*
 * plan_report.h - what `fsdp plan` and `fsdp shardmap` print: the plan as
 * text, JSON or SVG, and the shard map as a table or JSON. The figures come
 * from train/plan.h (the meta run) and engine/shardmap.h; nothing here
 * computes them.
 */
#ifndef FSDP_REPORT_PLAN_REPORT_H
#define FSDP_REPORT_PLAN_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "train/plan.h"

/* Human-readable report (the output of `fsdp plan`). */
void fsdp_plan_print(FILE *f, const fsdp_plan *p);

/* The plan as one JSON object (exact byte counts): configuration, per
 * device peak, breakdown at the peak, pinned host peak, collectives of a
 * step, the formula, and "fits" (null without a cap). */
void fsdp_plan_write_json(FILE *f, const fsdp_plan *p);

/* Stacked bars of each device's memory at its peak, by kind, next to its
 * pinned host memory, with the cap as a line if set. */
fsdp_status fsdp_plan_write_svg(const fsdp_plan *p, const char *path);

/* The shard map (`fsdp shardmap`): a row per unit and rank with the rank's
 * element range [begin, end) in the unit's flat buffer and how many of
 * those elements are real parameters (the rest is padding). With params,
 * each row also lists the parameter slices the rank owns, as
 * name[first:last) in the parameter's own flat indices. */
void fsdp_plan_shardmap_table(FILE *f, const fsdp_shardmap *sm, const char *model, bool params);
/* The same as JSON: model, devices, shard, params, padded_params, and per
 * unit name, numel, padded_numel, shard_numel, params [{name, shape,
 * offset, numel}], ranks [{rank, begin, end, real}]. */
void fsdp_plan_shardmap_json(FILE *f, const fsdp_shardmap *sm, const char *model);

#endif /* FSDP_REPORT_PLAN_REPORT_H */
