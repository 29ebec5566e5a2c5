/*
 * fuzz_metrics.c - libFuzzer target for the metrics JSON Lines reader of
 * `fsdp plot` (fsdp_metrics_read), then the chart drawn from whatever it
 * accepted, into /dev/null. Beyond memory safety it checks the reader's
 * promises: steps finite, peaks indexed within their array, and at most
 * FSDP_PLOT_MAX_DEVICES per line.
 */
#include <math.h>

#include "fuzz_common.h"
#include "report/plot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *sink;
    if (!sink && !(sink = fopen("/dev/null", "w")))
        abort();
    const char *path = fuzz_temp_file(data, size, ".jsonl");
    fsdp_metrics m;
    if (fsdp_metrics_read(path, &m) != FSDP_STATUS_OK) {
        if (m.n_steps != 0 || m.step || m.peak) /* an error leaves nothing behind */
            abort();
        return 0;
    }
    if (m.n_steps < 1 || m.peak_first[0] != 0 || m.n_devices > FSDP_PLOT_MAX_DEVICES)
        abort();
    for (int i = 0; i < m.n_steps; i++) {
        int n = m.peak_first[i + 1] - m.peak_first[i];
        if (!isfinite(m.step[i]) || n < 0 || n > m.n_devices)
            abort();
    }
    if (fsdp_metrics_write_svg(&m, "fuzz", sink) != FSDP_STATUS_OK)
        abort();
    fsdp_metrics_free(&m);
    return 0;
}
