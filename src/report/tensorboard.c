/*
 * tensorboard.c - TensorBoard event files (tensorboard.h): a protocol-buffer
 * encoder for the three Event shapes fsdp writes, TFRecord framing, the
 * file writer, and the trainer's sink that turns a metrics record into
 * tags.
 *
 * The encoder writes only what it needs: varints, 64- and 32-bit
 * little-endian fields and length-delimited fields, with nested lengths
 * computed up front (a Value and a Summary are small and their sizes are
 * sums), so nothing is encoded twice.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "report/tensorboard.h"

/* ---- protocol buffers ------------------------------------------------------------ */

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

/* Event, Summary, Summary.Value and SessionLog field numbers (tensorboard.h). */
enum {
    EVENT_WALL_TIME = 1,
    EVENT_STEP = 2,
    EVENT_FILE_VERSION = 3,
    EVENT_SUMMARY = 5,
    EVENT_SESSION_LOG = 7,
    SUMMARY_VALUE = 1,
    VALUE_TAG = 1,
    VALUE_SIMPLE_VALUE = 2,
    SESSION_LOG_STATUS = 1,
    SESSION_LOG_START = 1,
};

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static void put_varint(fsdp_sbuf *b, uint64_t v)
{
    unsigned char buf[10];
    size_t n = 0;
    while (v >= 0x80) {
        buf[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    buf[n++] = (unsigned char)v;
    fsdp_sbuf_put(b, buf, n);
}

static void put_key(fsdp_sbuf *b, int field, int wire)
{
    put_varint(b, (uint64_t)field << 3 | (uint64_t)wire);
}

/* The low n bytes of v, least significant first. */
static void put_le(fsdp_sbuf *b, uint64_t v, int n)
{
    unsigned char buf[8];
    for (int i = 0; i < n; i++)
        buf[i] = (unsigned char)(v >> (8 * i));
    fsdp_sbuf_put(b, buf, (size_t)n);
}

static void put_double(fsdp_sbuf *b, int field, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(b, field, WIRE_I64);
    put_le(b, bits, 8);
}

static void put_float(fsdp_sbuf *b, int field, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(b, field, WIRE_I32);
    put_le(b, bits, 4);
}

/* The key and length of a length-delimited field of n bytes (its bytes follow). */
static void put_len(fsdp_sbuf *b, int field, size_t n)
{
    put_key(b, field, WIRE_LEN);
    put_varint(b, n);
}

/* Bytes of a length-delimited field with a one-byte key holding n bytes. */
static size_t len_field_size(size_t n)
{
    return 1 + varint_len(n) + n;
}

/* What every Event starts with: wall_time, and step unless it is 0 (the
 * default, left out as protobuf's encoders do). */
static void put_event_head(fsdp_sbuf *b, double wall_time, int64_t step)
{
    put_double(b, EVENT_WALL_TIME, wall_time);
    if (step != 0) {
        put_key(b, EVENT_STEP, WIRE_VARINT);
        put_varint(b, (uint64_t)step); /* int64: two's complement, as protobuf does */
    }
}

void fsdp_tboard_event_version(fsdp_sbuf *b, double wall_time)
{
    put_event_head(b, wall_time, 0);
    size_t n = strlen(FSDP_TBOARD_FILE_VERSION);
    put_len(b, EVENT_FILE_VERSION, n);
    fsdp_sbuf_put(b, FSDP_TBOARD_FILE_VERSION, n);
}

void fsdp_tboard_event_start(fsdp_sbuf *b, double wall_time, int64_t step)
{
    put_event_head(b, wall_time, step);
    put_len(b, EVENT_SESSION_LOG, 2); /* SessionLog { status = START } */
    put_key(b, SESSION_LOG_STATUS, WIRE_VARINT);
    put_varint(b, SESSION_LOG_START);
}

/* Bytes of Value { tag, simple_value }. */
static size_t value_size(const fsdp_tboard_scalar *v)
{
    return len_field_size(strlen(v->tag)) + 1 + 4;
}

void fsdp_tboard_event_scalars(fsdp_sbuf *b, double wall_time, int64_t step,
                               const fsdp_tboard_scalar *v, int n)
{
    put_event_head(b, wall_time, step);
    size_t summary = 0;
    for (int i = 0; i < n; i++)
        summary += len_field_size(value_size(&v[i]));
    put_len(b, EVENT_SUMMARY, summary);
    for (int i = 0; i < n; i++) {
        size_t tag = strlen(v[i].tag);
        put_len(b, SUMMARY_VALUE, value_size(&v[i]));
        put_len(b, VALUE_TAG, tag);
        fsdp_sbuf_put(b, v[i].tag, tag);
        put_float(b, VALUE_SIMPLE_VALUE, v[i].value);
    }
}

void fsdp_tfrecord_frame(const void *data, size_t n, unsigned char header[12],
                         unsigned char footer[4])
{
    uint64_t len = n;
    for (int i = 0; i < 8; i++)
        header[i] = (unsigned char)(len >> (8 * i));
    uint32_t hc = fsdp_crc32c_mask(fsdp_crc32c(0, header, 8));
    uint32_t dc = fsdp_crc32c_mask(fsdp_crc32c(0, data, n));
    for (int i = 0; i < 4; i++) {
        header[8 + i] = (unsigned char)(hc >> (8 * i));
        footer[i] = (unsigned char)(dc >> (8 * i));
    }
}

/* ---- the writer -------------------------------------------------------------------- */

struct fsdp_tboard {
    FILE *f;
    char path[4096];
    bool failed; /* a write failed: every later one is refused */
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The event (the bytes of b) as one record, flushed. */
static fsdp_status write_record(fsdp_tboard *tb, const fsdp_sbuf *b, int64_t step)
{
    if (tb->failed)
        return fsdp_error_set(FSDP_STATUS_IO, "TensorBoard event file '%s' failed earlier",
                              tb->path);
    if (b->oom)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory encoding a TensorBoard event");
    unsigned char head[12], foot[4];
    fsdp_tfrecord_frame(b->p, b->n, head, foot);
    errno = 0;
    bool ok = fwrite(head, 1, sizeof head, tb->f) == sizeof head;
    ok = ok && fwrite(b->p, 1, b->n, tb->f) == b->n;
    ok = ok && fwrite(foot, 1, sizeof foot, tb->f) == sizeof foot;
    ok = ok && fflush(tb->f) == 0;
    if (ok)
        return FSDP_STATUS_OK;
    tb->failed = true;
    return fsdp_error_set(FSDP_STATUS_IO, "cannot write TensorBoard event file '%s' at step "
                          "%lld: %s", tb->path, (long long)step,
                          errno ? strerror(errno) : "write error");
}

/* A new file in dir named for this moment (tensorboard.h); another name
 * for the same nanosecond gets a counter. */
static fsdp_status create_file(fsdp_tboard *tb, const char *dir)
{
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0])
        snprintf(host, sizeof host, "localhost");
    for (char *c = host; *c; c++)
        if (*c == '/')
            *c = '_';
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (int k = 0; k < 100; k++) {
        char extra[16] = "";
        if (k)
            snprintf(extra, sizeof extra, ".%02d", k);
        int n = snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%010lld.%s.%09ld%s",
                         dir, (long long)ts.tv_sec, host, ts.tv_nsec, extra);
        if (n < 0 || (size_t)n >= sizeof tb->path)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--tensorboard '%s': the path is too "
                                  "long", dir);
        tb->f = fopen(tb->path, "wbx"); /* never an existing file */
        if (tb->f)
            return FSDP_STATUS_OK;
        if (errno != EEXIST)
            break;
    }
    return fsdp_error_set(FSDP_STATUS_IO, "--tensorboard '%s': cannot create event file '%s': "
                          "%s; choose a writable directory", dir, tb->path, strerror(errno));
}

fsdp_status fsdp_tboard_open(fsdp_tboard **out, const char *dir, int64_t first_step)
{
    *out = NULL;
    FSDP_TRY(fsdp_output_dir_check(dir, "--tensorboard"));
    fsdp_tboard *tb = calloc(1, sizeof *tb);
    if (!tb)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    fsdp_status st = create_file(tb, dir);
    if (st != FSDP_STATUS_OK) {
        free(tb);
        return st;
    }
    fsdp_sbuf b = {0};
    double now = wall_now();
    fsdp_tboard_event_version(&b, now);
    st = write_record(tb, &b, 0);
    if (st == FSDP_STATUS_OK) {
        b.n = 0;
        fsdp_tboard_event_start(&b, now, first_step);
        st = write_record(tb, &b, first_step);
    }
    free(b.p);
    if (st != FSDP_STATUS_OK) {
        fsdp_tboard_close(tb);
        return st;
    }
    *out = tb;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_tboard_write(fsdp_tboard *tb, int64_t step, const fsdp_tboard_scalar *v, int n)
{
    fsdp_sbuf b = {0};
    fsdp_tboard_event_scalars(&b, wall_now(), step, v, n);
    fsdp_status st = write_record(tb, &b, step);
    free(b.p);
    return st;
}

const char *fsdp_tboard_path(const fsdp_tboard *tb)
{
    return tb->path;
}

fsdp_status fsdp_tboard_close(fsdp_tboard *tb)
{
    if (!tb)
        return FSDP_STATUS_OK;
    errno = 0;
    bool ok = !ferror(tb->f);
    ok = fclose(tb->f) == 0 && ok;
    fsdp_status st = FSDP_STATUS_OK;
    if (!ok && !tb->failed)
        st = fsdp_error_set(FSDP_STATUS_IO, "error writing TensorBoard event file '%s': %s",
                            tb->path, errno ? strerror(errno) : "write error");
    free(tb);
    return st;
}

/* ---- the trainer's sink ------------------------------------------------------------ */

enum { TAG_MAX = 48 }; /* "memory/peak_bytes/device_1023" and the like */

static fsdp_status sink_open(void *self, int done)
{
    fsdp_tboard_sink *s = self;
    return fsdp_tboard_open(&s->tb, s->dir, (int64_t)done + 1);
}

static fsdp_status sink_write(void *self, const fsdp_metrics_record *r)
{
    fsdp_tboard_sink *s = self;
    int n_max = 7 + r->n_ranks, n = 0;
    fsdp_tboard_scalar *v = malloc((size_t)n_max * sizeof *v);
    char (*tags)[TAG_MAX] = malloc((size_t)(r->n_ranks > 0 ? r->n_ranks : 1) * sizeof *tags);
    if (!v || !tags) {
        free(v);
        free(tags);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a TensorBoard event");
    }
    v[n++] = (fsdp_tboard_scalar){"train/loss", (float)r->loss};
    v[n++] = (fsdp_tboard_scalar){"train/lr", (float)r->lr};
    v[n++] = (fsdp_tboard_scalar){"train/grad_norm", (float)r->grad_norm};
    v[n++] = (fsdp_tboard_scalar){"train/tokens_per_s", (float)r->tokens_per_s};
    v[n++] = (fsdp_tboard_scalar){"train/step_ms", (float)r->step_ms};
    if (r->mfu >= 0)
        v[n++] = (fsdp_tboard_scalar){"train/mfu", (float)r->mfu};
    if (r->has_eval)
        v[n++] = (fsdp_tboard_scalar){"eval/loss", (float)r->eval_loss};
    for (int d = 0; d < r->n_ranks; d++) {
        snprintf(tags[d], sizeof tags[d], "memory/peak_bytes/device_%d", d);
        v[n++] = (fsdp_tboard_scalar){tags[d], (float)r->stats[d].peak_bytes};
    }
    fsdp_status st = fsdp_tboard_write(s->tb, r->step, v, n);
    free(v);
    free(tags);
    return st;
}

static fsdp_status sink_eval(void *self, int step, const char *name, double value)
{
    fsdp_tboard_sink *s = self;
    char tag[TAG_MAX];
    snprintf(tag, sizeof tag, "eval/%s", name);
    fsdp_tboard_scalar v = {tag, (float)value};
    return fsdp_tboard_write(s->tb, step, &v, 1);
}

static fsdp_status sink_close(void *self)
{
    fsdp_tboard_sink *s = self;
    fsdp_status st = fsdp_tboard_close(s->tb);
    s->tb = NULL;
    return st;
}

static const fsdp_metrics_sink_i tboard_sink_i = {
    /* .open  = */ sink_open,
    /* .write = */ sink_write,
    /* .eval  = */ sink_eval,
    /* .close = */ sink_close,
};

void fsdp_tboard_sink_init(fsdp_tboard_sink *s, const char *dir)
{
    *s = (fsdp_tboard_sink){.sink = {.iface = &tboard_sink_i, .self = s}, .dir = dir};
}
