/*
 * log.c - logging and the table of environment settings.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"

static const struct {
    const char *name;
    const char *dflt;
} env_table[FSDP_ENV_COUNT] = {
    [FSDP_ENV_LOG] = {"FSDP_LOG", "warn"},
    [FSDP_ENV_LOG_SUBSYS] = {"FSDP_LOG_SUBSYS", "all"},
    [FSDP_ENV_CPU_THREADS] = {"FSDP_CPU_THREADS", "0"},
    [FSDP_ENV_RDV_DIR] = {"FSDP_RDV_DIR", ""},
    [FSDP_ENV_PROCESS] = {"FSDP_PROCESS", ""},
    [FSDP_ENV_N_PROCESSES] = {"FSDP_N_PROCESSES", ""},
    [FSDP_ENV_PEER_TIMEOUT] = {"FSDP_PEER_TIMEOUT", "600"},
    [FSDP_ENV_ABORT_GRACE] = {"FSDP_ABORT_GRACE", "10"},
    [FSDP_ENV_FAULT] = {"FSDP_FAULT", ""},
    [FSDP_ENV_CPU_STREAMS] = {"FSDP_CPU_STREAMS", "inline"},
    [FSDP_ENV_CPU_STREAM_JITTER] = {"FSDP_CPU_STREAM_JITTER", "0"},
    [FSDP_ENV_CHAT_DATE] = {"FSDP_CHAT_DATE", ""},
    [FSDP_ENV_WATCHDOG] = {"FSDP_WATCHDOG", "300"},
};

static const char *env_values[FSDP_ENV_COUNT];
static fsdp_log_level log_level = FSDP_LOG_WARN;
static unsigned log_mask = FSDP_SUB_ALL;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static _Thread_local int tls_rank = -1;

static unsigned parse_subsys(const char *s)
{
    static const struct {
        const char *name;
        unsigned bit;
    } subs[] = {
        {"core", FSDP_SUB_CORE}, {"alloc", FSDP_SUB_ALLOC}, {"comm", FSDP_SUB_COMM},
        {"shard", FSDP_SUB_SHARD}, {"ops", FSDP_SUB_OPS}, {"optim", FSDP_SUB_OPTIM},
        {"data", FSDP_SUB_DATA}, {"ckpt", FSDP_SUB_CKPT}, {"train", FSDP_SUB_TRAIN},
        {"all", FSDP_SUB_ALL},
    };
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
            if (!strcasecmp(tok, subs[i].name))
                mask |= subs[i].bit;
    }
    return mask ? mask : FSDP_SUB_ALL;
}

static void env_load(void)
{
    for (int i = 0; i < FSDP_ENV_COUNT; i++) {
        const char *v = getenv(env_table[i].name);
        env_values[i] = (v && *v) ? v : env_table[i].dflt;
    }
    const char *lv = env_values[FSDP_ENV_LOG];
    if (!strcasecmp(lv, "error"))
        log_level = FSDP_LOG_ERROR;
    else if (!strcasecmp(lv, "info"))
        log_level = FSDP_LOG_INFO;
    else if (!strcasecmp(lv, "debug"))
        log_level = FSDP_LOG_DEBUG;
    else
        log_level = FSDP_LOG_WARN;
    log_mask = parse_subsys(env_values[FSDP_ENV_LOG_SUBSYS]);
}

const char *fsdp_env_get(fsdp_env_key key)
{
    pthread_once(&env_once, env_load);
    return env_values[key];
}

bool fsdp_log_enabled(fsdp_log_level lvl, unsigned subsys)
{
    pthread_once(&env_once, env_load);
    if (lvl > log_level)
        return false;
    return lvl <= FSDP_LOG_WARN || (subsys & log_mask);
}

void fsdp_log_set_rank(int rank) { tls_rank = rank; }
int fsdp_log_rank(void) { return tls_rank; }

void fsdp_log_write(fsdp_log_level lvl, const char *fmt, ...)
{
    static const char *const tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char line[2048];
    int n;
    if (tls_rank >= 0)
        n = snprintf(line, sizeof line, "fsdp[rank %d] %s: ", tls_rank, tags[lvl]);
    else
        n = snprintf(line, sizeof line, "fsdp %s: ", tags[lvl]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one call: lines from ranks don't interleave */
}
