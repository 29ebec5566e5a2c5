/*
 * fit_report.h - what `fsdp plan --fit` prints: the settings that fit,
 * fastest first, why the others do not, the chosen one as a `fsdp train`
 * command line, and the cost model's figures; as text or as JSON. The
 * figures come from train/fit.h; nothing here computes them.
 */
#ifndef FSDP_REPORT_FIT_REPORT_H
#define FSDP_REPORT_FIT_REPORT_H

#include <stdio.h>

#include "train/fit.h"

/* The human-readable answer. At most `top` fitting settings and `top`
 * exclusions are listed one per line (the rest are counted; the JSON has
 * every candidate). */
void fsdp_fit_print(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r, int top);

/* One JSON object: the request (model, devices, seq, precision, global
 * batch, caps, backend, machine figures), the search (candidates, runs,
 * pruned, wall time), "chosen" (null when nothing fits) with its command,
 * and "candidates": every candidate with its verdict, exact bytes, cost
 * terms (measured ones) and rank (fitting ones), or what pruned it. */
void fsdp_fit_write_json(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r);

#endif /* FSDP_REPORT_FIT_REPORT_H */
