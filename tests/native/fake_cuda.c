/* A stand-in for the CUDA driver library (libcuda.so.1) for tests/test_cuda_native.py: the
 * driver API functions the C CUDA clock (instrumented_convs/core/native/_speedups_cuda.c)
 * loads, with the driver's signatures, over a fake device clock, plus fake_* functions the
 * test calls through ctypes to script the device and read what the clock asked of it.
 *
 * The model, kept small:
 *  - devices 0..FAKE_DEVICES-1, one primary context each (cuDevicePrimaryCtxRetain); each
 *    thread has its own stack of current contexts (cuCtxGetCurrent / Push / Pop);
 *  - streams: 0 and the special handles 1 (legacy) and 2 (per-thread) are the default stream
 *    of the current context's device; others come from fake_stream(dev);
 *  - an event belongs to the device of the context current at cuEventCreate (none current:
 *    CUDA_ERROR_INVALID_CONTEXT); recording it on a stream of another device fails with
 *    CUDA_ERROR_INVALID_HANDLE, as cuEventElapsedTime does for two devices' events;
 *  - the host clock is what the test last set (fake_set_host_ns), and a record costs the host
 *    fake_set_record_cost_ns (the test's CPU clock reads fake_host_ns); a device runs its stream in
 *    order: an event recorded at host time h gets the device time max(h + latency, tail),
 *    tail being where the device's queued work ends (fake_launch queues a kernel);
 *  - an event completes when the device gets there: fake_progress(dev, t) completes those
 *    whose device time is <= t, fake_complete_all() all; cuEventQuery answers
 *    CUDA_ERROR_NOT_READY until then; cuEventSynchronize waits for it: the device gets there
 *    (the events before it on its device complete too: one stream, run in order);
 *  - fake_set_capturing(1): cuStreamIsCapturing says every stream captures, and a record on
 *    a capturing stream fails (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: timing events);
 *  - fake_fail_next(name, err): the next call of that function returns err (fake_fail_after:
 *    the call after n more);
 *  - built with -DFAKE_WITHOUT_CAPTURE_QUERY it lacks cuStreamIsCapturing (a partial driver);
 *  - destroyed events stay allocated (till fake_reset) so that any later use is seen: it
 *    answers CUDA_ERROR_INVALID_HANDLE and counts in fake_misuse().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;

enum {
    OK = 0,
    ERR_INVALID_VALUE = 1,
    ERR_NOT_INITIALIZED = 3,
    ERR_INVALID_DEVICE = 101,
    ERR_INVALID_CONTEXT = 201,
    ERR_INVALID_HANDLE = 400,
    ERR_NOT_READY = 600,
    ERR_CAPTURE_UNSUPPORTED = 900,
    ERR_CAPTURE_INVALIDATED = 901,
    FAKE_DEVICES = 4,
    EVENT_MAGIC = 0x5eed,
    STREAM_MAGIC = 0x57ea,
    CTX_MAGIC = 0xc7c7,
    CU_EVENT_DISABLE_TIMING = 2,
};

typedef struct Ctx { int magic, dev; } Ctx;
typedef struct Stream { int magic, dev; struct Stream *next; } Stream;
typedef struct Event {
    int magic, dev, alive, recorded, done, timing;
    long long t;    /* device time, ns */
    long long seq;  /* which record this was (1, 2, ...) */
    struct Event *next;
} Event;

/* every function the clock resolves, and the fake's counters of their calls */
static const char *NAMES[] = {
    "cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent",
    "cuCtxPushCurrent", "cuCtxPopCurrent", "cuEventCreate", "cuEventRecord", "cuEventQuery",
    "cuEventSynchronize", "cuEventElapsedTime", "cuEventDestroy", "cuStreamIsCapturing",
};
enum { F_INIT, F_DEVGET, F_RETAIN, F_GETCUR, F_PUSH, F_POP, F_CREATE, F_RECORD, F_QUERY,
       F_SYNC, F_ELAPSED, F_DESTROY, F_CAPTURING, NFN };

static struct {
    int init, capturing;
    long long calls[NFN];
    int fail[NFN];  /* the error a coming call returns, 0: none */
    int fail_skip[NFN];  /* how many calls pass before it */
    int broken;  /* a capture was invalidated (a record on a capturing stream) */
    Ctx ctx[FAKE_DEVICES];
    int retained[FAKE_DEVICES];
    long long latency[FAKE_DEVICES], tail[FAKE_DEVICES];
    long long host, record_cost, records, misuse, last_synced, generation;
    long long live;  /* events created, less destroyed */
    Event *events;
    Stream *streams;
    void *last_stream;
} g;

/* this thread's stack of current contexts (a generation older than the fake's: empty) */
static __thread Ctx *t_stack[64];
static __thread int t_depth;
static __thread long long t_gen = -1;

static int index_of(const char *name) {
    size_t n = strlen(name);
    if (n > 3 && strcmp(name + n - 3, "_v2") == 0) n -= 3;  /* cuEventDestroy_v2: cuEventDestroy */
    for (int i = 0; i < NFN; i++)
        if (strlen(NAMES[i]) == n && strncmp(NAMES[i], name, n) == 0) return i;
    return -1;
}

static CUresult enter(int f) {
    g.calls[f]++;
    if (g.fail[f] && g.fail_skip[f]-- == 0) { CUresult r = g.fail[f]; g.fail[f] = 0; return r; }
    if (f != F_INIT && !g.init) return ERR_NOT_INITIALIZED;
    return OK;
}

static Ctx *current(void) {
    if (t_gen != g.generation) { t_gen = g.generation; t_depth = 0; }
    return t_depth ? t_stack[t_depth - 1] : NULL;
}

static Event *as_event(void *h) {
    Event *e = h;
    if (e == NULL || e->magic != EVENT_MAGIC) return NULL;
    if (!e->alive) { g.misuse++; return NULL; }
    return e;
}

/* the device of a stream: a default stream is the current context's; -1 for none */
static int stream_device(void *s) {
    uintptr_t v = (uintptr_t)s;
    if (v <= 2) { Ctx *c = current(); return c ? c->dev : -1; }
    Stream *st = s;
    return st->magic == STREAM_MAGIC ? st->dev : -2;
}

void fake_progress(int dev, long long t);

/* -- the driver API ---------------------------------------------------------------------- */

CUresult cuInit(unsigned flags) {
    CUresult r = enter(F_INIT);
    if (r) return r;
    if (flags != 0) return ERR_INVALID_VALUE;
    g.init = 1;
    return OK;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    CUresult r = enter(F_DEVGET);
    if (r) return r;
    if (ordinal < 0 || ordinal >= FAKE_DEVICES) return ERR_INVALID_DEVICE;
    *dev = ordinal;
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(void **pctx, CUdevice dev) {
    CUresult r = enter(F_RETAIN);
    if (r) return r;
    if (dev < 0 || dev >= FAKE_DEVICES) return ERR_INVALID_DEVICE;
    g.retained[dev]++;
    *pctx = &g.ctx[dev];
    return OK;
}

CUresult cuCtxGetCurrent(void **pctx) {
    CUresult r = enter(F_GETCUR);
    if (r) return r;
    *pctx = current();
    return OK;
}

static CUresult push(void *c) {
    CUresult r = enter(F_PUSH);
    if (r) return r;
    Ctx *ctx = c;
    if (ctx == NULL || ctx->magic != CTX_MAGIC) return ERR_INVALID_CONTEXT;
    current();
    if (t_depth == 64) return ERR_INVALID_VALUE;
    t_stack[t_depth++] = ctx;
    return OK;
}
CUresult cuCtxPushCurrent_v2(void *c) { return push(c); }
CUresult cuCtxPushCurrent(void *c) { return push(c); }

static CUresult pop(void **pctx) {
    CUresult r = enter(F_POP);
    if (r) return r;
    if (current() == NULL) return ERR_INVALID_CONTEXT;
    Ctx *c = t_stack[--t_depth];
    if (pctx) *pctx = c;
    return OK;
}
CUresult cuCtxPopCurrent_v2(void **pctx) { return pop(pctx); }
CUresult cuCtxPopCurrent(void **pctx) { return pop(pctx); }

CUresult cuEventCreate(void **pev, unsigned flags) {
    CUresult r = enter(F_CREATE);
    if (r) return r;
    Ctx *c = current();
    if (c == NULL) return ERR_INVALID_CONTEXT;
    Event *e = calloc(1, sizeof(Event));
    if (e == NULL) return 2;  /* CUDA_ERROR_OUT_OF_MEMORY */
    e->magic = EVENT_MAGIC;
    e->dev = c->dev;
    e->alive = 1;
    e->timing = !(flags & CU_EVENT_DISABLE_TIMING);
    e->done = 1;  /* a new event: cuEventQuery says CUDA_SUCCESS */
    e->next = g.events;
    g.events = e;
    g.live++;
    *pev = e;
    return OK;
}

CUresult cuEventRecord(void *ev, void *stream) {
    CUresult r = enter(F_RECORD);
    if (r) return r;
    Event *e = as_event(ev);
    if (e == NULL) return ERR_INVALID_HANDLE;
    int dev = stream_device(stream);
    if (dev == -1) return ERR_INVALID_CONTEXT;
    if (dev < 0 || dev != e->dev) return ERR_INVALID_HANDLE;
    if (g.capturing) { g.broken = 1; return ERR_CAPTURE_UNSUPPORTED; }
    long long t = g.host + g.latency[dev];
    if (t < g.tail[dev]) t = g.tail[dev];
    g.tail[dev] = t;
    e->t = t;
    e->recorded = 1;
    e->done = 0;
    e->seq = ++g.records;
    g.last_stream = stream;
    g.host += g.record_cost;
    return OK;
}

CUresult cuEventQuery(void *ev) {
    CUresult r = enter(F_QUERY);
    if (r) return r;
    Event *e = as_event(ev);
    if (e == NULL) return ERR_INVALID_HANDLE;
    return e->done ? OK : ERR_NOT_READY;
}

CUresult cuEventSynchronize(void *ev) {
    CUresult r = enter(F_SYNC);
    if (r) return r;
    Event *e = as_event(ev);
    if (e == NULL) return ERR_INVALID_HANDLE;
    if (e->recorded) fake_progress(e->dev, e->t);
    e->done = 1;
    g.last_synced = e->seq;
    return OK;
}

static CUresult elapsed(float *ms, void *a, void *b) {
    CUresult r = enter(F_ELAPSED);
    if (r) return r;
    Event *s = as_event(a), *e = as_event(b);
    if (s == NULL || e == NULL || !s->recorded || !e->recorded || !s->timing || !e->timing)
        return ERR_INVALID_HANDLE;
    if (s->dev != e->dev) return ERR_INVALID_HANDLE;
    if (!s->done || !e->done) return ERR_NOT_READY;
    *ms = (float)((double)(e->t - s->t) / 1e6);
    return OK;
}
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { return elapsed(ms, a, b); }

static CUresult destroy(void *ev) {
    CUresult r = enter(F_DESTROY);
    if (r) return r;
    Event *e = as_event(ev);
    if (e == NULL) return ERR_INVALID_HANDLE;
    e->alive = 0;
    g.live--;
    return OK;
}
CUresult cuEventDestroy_v2(void *ev) { return destroy(ev); }
CUresult cuEventDestroy(void *ev) { return destroy(ev); }

#ifndef FAKE_WITHOUT_CAPTURE_QUERY
CUresult cuStreamIsCapturing(void *stream, int *status) {
    CUresult r = enter(F_CAPTURING);
    if (r) return r;
    int dev = stream_device(stream);
    if (dev == -1) return ERR_INVALID_CONTEXT;
    if (dev < 0) return ERR_INVALID_HANDLE;
    *status = g.capturing;  /* CU_STREAM_CAPTURE_STATUS_ACTIVE is 1 */
    return OK;
}
#endif

/* -- the test's controls ----------------------------------------------------------------- */

/* Forget everything: events, streams, counters, contexts, the device clocks. */
void fake_reset(void) {
    for (Event *e = g.events, *n; e; e = n) { n = e->next; e->magic = 0; free(e); }
    for (Stream *s = g.streams, *n; s; s = n) { n = s->next; s->magic = 0; free(s); }
    long long gen = g.generation + 1;
    memset(&g, 0, sizeof(g));
    g.generation = gen;
    for (int i = 0; i < FAKE_DEVICES; i++) { g.ctx[i].magic = CTX_MAGIC; g.ctx[i].dev = i; }
}

__attribute__((constructor)) static void fake_init(void) { fake_reset(); }

/* The host clock (ns) that events recorded from now on start from. */
void fake_set_host_ns(long long t) { g.host = t; }
long long fake_host_ns(void) { return g.host; }
/* How long a record keeps the host (ns): the tool's own time inside a step. */
void fake_set_record_cost_ns(long long ns) { g.record_cost = ns; }
/* What a record on device dev adds to the host clock when the device is idle (ns). */
void fake_set_latency_ns(int dev, long long ns) { g.latency[dev] = ns; }
/* A kernel of ns device time launched now on dev's stream: it starts when the device gets to
 * it (after the work queued), and delays the events recorded after it. */
void fake_launch(int dev, long long ns) {
    long long start = g.host + g.latency[dev];
    if (start < g.tail[dev]) start = g.tail[dev];
    g.tail[dev] = start + ns;
}
/* Where dev's queued work ends (ns of device time). */
long long fake_tail_ns(int dev) { return g.tail[dev]; }
/* The device dev got to time t: its events recorded up to there complete. */
void fake_progress(int dev, long long t) {
    for (Event *e = g.events; e; e = e->next)
        if (e->alive && e->recorded && e->dev == dev && e->t <= t) e->done = 1;
}
void fake_complete_all(void) {
    for (Event *e = g.events; e; e = e->next) e->done = 1;
}
void fake_complete(void *ev) {
    Event *e = as_event(ev);
    if (e) e->done = 1;
}
void fake_set_capturing(int on) { g.capturing = on; }
/* The call of function name (cuEventRecord, ...) after skip more returns err: 0, or -1 (no
 * such name). */
int fake_fail_after(const char *name, int skip, int err) {
    int i = index_of(name);
    if (i < 0) return -1;
    g.fail[i] = err;
    g.fail_skip[i] = skip;
    return 0;
}
int fake_fail_next(const char *name, int err) { return fake_fail_after(name, 0, err); }
int fake_capture_broken(void) { return g.broken; }
/* How many times function name was called (-1: no such name). */
long long fake_calls(const char *name) {
    int i = index_of(name);
    return i < 0 ? -1 : g.calls[i];
}
long long fake_live_events(void) { return g.live; }
long long fake_records(void) { return g.records; }
/* Uses of destroyed events (a bug of the caller). */
long long fake_misuse(void) { return g.misuse; }
/* The record number (1, 2, ...) of the event cuEventSynchronize last waited for. */
long long fake_last_synced(void) { return g.last_synced; }
void *fake_last_stream(void) { return g.last_stream; }
/* An event's device (-1: not an event of this fake, or destroyed), time, record number. */
int fake_event_device(void *ev) {
    Event *e = ev;
    return e && e->magic == EVENT_MAGIC && e->alive ? e->dev : -1;
}
long long fake_event_time_ns(void *ev) { return ((Event *)ev)->t; }
long long fake_event_seq(void *ev) { return ((Event *)ev)->seq; }
int fake_event_done(void *ev) { return ((Event *)ev)->done; }
/* A stream of device dev (a handle). */
void *fake_stream(int dev) {
    Stream *s = calloc(1, sizeof(Stream));
    if (s == NULL) return NULL;
    s->magic = STREAM_MAGIC;
    s->dev = dev;
    s->next = g.streams;
    g.streams = s;
    return s;
}
/* Make device dev's primary context this thread's only current one (-1: none current). */
void fake_set_current(int dev) {
    current();
    t_depth = 0;
    if (dev >= 0) t_stack[t_depth++] = &g.ctx[dev];
}
/* The device of this thread's current context, -1 for none; and the stack's depth. */
int fake_current_device(void) {
    Ctx *c = current();
    return c ? c->dev : -1;
}
int fake_ctx_depth(void) { current(); return t_depth; }
int fake_retained(int dev) { return g.retained[dev]; }
