/* The CUDA clock in C: timing events created, recorded, queried and read through the CUDA
 * driver API, loaded at run time (dlopen), so the extension builds and installs without a CUDA
 * toolkit. Events come from a pool per device and are recorded on the current stream, read with
 * torch's raw reader (torch._C._cuda_getCurrentRawStream); a capturing stream records nothing.
 * Recorded pairs wait in a queue, resolved lazily: a pair's device time, its host time and its
 * lag (how far the device was behind the host at its end) are folded into its entry.
 * The Python twin: clocks.events (record_event) and clocks.pending (PendingTimes, DeviceLag).
 */
#include "_speedups.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef _WIN32
#include <dlfcn.h>
#endif

typedef int CUresult;
typedef void *CUevent, *CUstream, *CUcontext;
typedef int CUdevice;
enum { CU_OK = 0, CU_NOT_READY = 600, MAX_DEV = 64, LAG_BUCKETS = 8 };

static struct CuApi {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxPush)(CUcontext);
    CUresult (*CtxPop)(CUcontext *);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsed)(float *, CUevent, CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*StreamIsCapturing)(CUstream, int *);
} cu;
static void *g_lib = NULL;
int g_cuda_native = 0;  /* cuda_native(): StepBase times CUDA steps here */
static PyObject *g_get_device = NULL, *g_raw_stream = NULL, *g_fold_device = NULL;
static PyObject *s_start_ms = NULL, *s_end_ms = NULL, *s_ref = NULL;
static Py_ssize_t o_host = -1, o_dcalls, o_lag, o_caught;
static long long g_lag_floor = 50000, g_bucket_ns = 1000000000LL;
/* an entry's lag is read for its first g_lag_all pairs, then one in g_lag_every (lag_wanted) */
static long long g_lag_all = 32, g_lag_every = 8;
/* the queue's length at which the next poll comes (see cuda_poll_queue) */
static Py_ssize_t g_next_poll = 2048;
/* what the queue did (cuda_tally): polls, reads that found a pair unfinished, pairs folded,
 * waits; with g_tally on, the ns spent in records and in polls, and how many records */
static long long g_polls, g_unready, g_folded, g_waits, g_records, g_record_ns, g_poll_ns;
static int g_tally = 0;
/* With g_tally == 2, a poll's time split into laps: each lap() gives the ns since the last
 * one to a part, so the parts add up to the polls' time but for the clock reads themselves. */
enum { P_QUERY, P_READ, P_CONTEXT, P_LAG, P_TIMELINE, P_FOLD_C, P_FOLD_REGISTRY, P_FOLD_PYTHON, P_RELEASE,
       P_WAIT, P_OTHER, N_PARTS };
static const char *const g_part_names[N_PARTS] = {
    "query of the newest end", "read of a pair", "context", "lag", "timeline", "fold in C",
    "the registry's fold (Python)", "fold in Python (sampled, retired, unreadable)", "release",
    "wait", "other"};
static long long g_part_ns[N_PARTS], g_lap_t;
static int g_lapping = 0;  /* inside a poll with g_tally == 2 (a fold elsewhere is no lap) */
static inline void lap(int part) {
    if (!g_lapping) return;
    long long t = now_ns();
    g_part_ns[part] += t - g_lap_t;
    g_lap_t = t;
}

/* -- contexts and pools, per device ---------------------------------------------------- */

typedef struct {
    CUcontext ctx;  /* the device's primary context (torch's), retained once */
    CUevent *free;
    Py_ssize_t nfree, cap;
    /* the lag's zero (see clocks.pending.DeviceLag): a reference event, its place on an
     * abstract device timeline (ns), when it was recorded (CPU ns), and the least difference
     * between the device and the host per bucket of CPU time */
    CUevent ref;
    double ref_dev;
    long long ref_t;
    long long bucket[LAG_BUCKETS];
    double least[LAG_BUCKETS];
} Device;
static Device g_dev[MAX_DEV];

static int cu_fail(CUresult r, const char *what) {
    PyErr_Format(PyExc_RuntimeError, "instrumented_convs: CUDA driver %s failed (error %d)", what, r);
    return -1;
}

static int check_dev(int dev) {
    if (g_lib == NULL) { PyErr_SetString(PyExc_RuntimeError, "instrumented_convs: cuda_load() was not called"); return -1; }
    if (dev < 0 || dev >= MAX_DEV) { PyErr_Format(PyExc_ValueError, "no CUDA device %d", dev); return -1; }
    return 0;
}

/* Make device dev's primary context current on this thread if it is not (autograd's device
 * threads, the pin-memory thread): 1 when pushed (pop it with leave_ctx), 0 when already, -1. */
static int enter_ctx(int dev) {
    Device *d = &g_dev[dev];
    CUresult r;
    if (d->ctx == NULL) {
        CUdevice h;
        if ((r = cu.DeviceGet(&h, dev)) != CU_OK) return cu_fail(r, "cuDeviceGet");
        if ((r = cu.PrimaryCtxRetain(&d->ctx, h)) != CU_OK) { d->ctx = NULL; return cu_fail(r, "cuDevicePrimaryCtxRetain"); }
    }
    CUcontext cur = NULL;
    if ((r = cu.CtxGetCurrent(&cur)) != CU_OK) return cu_fail(r, "cuCtxGetCurrent");
    if (cur == d->ctx) return 0;
    if ((r = cu.CtxPush(d->ctx)) != CU_OK) return cu_fail(r, "cuCtxPushCurrent");
    return 1;
}

static void leave_ctx(int pushed) {
    if (pushed > 0) { CUcontext c; cu.CtxPop(&c); }
}

static void pool_put(int dev, CUevent ev) {
    Device *d = &g_dev[dev];
    if (d->nfree == d->cap) {
        Py_ssize_t cap = d->cap ? d->cap * 2 : 64;
        CUevent *p = realloc(d->free, cap * sizeof(CUevent));
        if (p == NULL) { cu.EventDestroy(ev); return; }  /* no room: the event goes */
        d->free = p;
        d->cap = cap;
    }
    d->free[d->nfree++] = ev;
}

/* Give an event back to device dev's pool (a step that ended untimed). */
void cuda_put_event(int dev, void *ev) {
    if (ev != NULL && dev >= 0 && dev < MAX_DEV) pool_put(dev, ev);
}

static int check_bound(int dev) {
    if (check_dev(dev) < 0) return -1;
    if (g_raw_stream == NULL || g_fold_device == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "instrumented_convs: cuda_bind() was not called");
        return -1;
    }
    return 0;
}

/* Record an event of device dev's pool on its current stream: 1 (*out set), 0 while the stream
 * captures a CUDA graph (nothing recorded, at a step's end too: an event recorded into a graph
 * keeps the times of its last use, which would read as the step's), -1 with an exception. */
static int record_now(int dev, void **out);

/* Device dev's current stream, read with torch's raw reader: 0, or -1 with an exception. */
static int raw_stream_of(int dev, CUstream *out) {
    PyObject *idx = PyLong_FromLong(dev);
    PyObject *s = idx ? PyObject_CallOneArg(g_raw_stream, idx) : NULL;
    Py_XDECREF(idx);
    if (s == NULL) return -1;
    *out = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

int cuda_record_now(int dev, void **out) {
    if (!g_tally) return record_now(dev, out);
    long long t0 = now_ns();
    int r = record_now(dev, out);
    g_record_ns += now_ns() - t0;
    g_records++;
    return r;
}

static int record_now(int dev, void **out) {
    CUstream stream;
    if (check_bound(dev) < 0 || raw_stream_of(dev, &stream) < 0) return -1;
    int pushed = enter_ctx(dev), rc = -1, capturing = 0;
    if (pushed < 0) return -1;
    CUresult r = cu.StreamIsCapturing(stream, &capturing);
    if (r != CU_OK) { cu_fail(r, "cuStreamIsCapturing"); goto done; }
    if (capturing) { rc = 0; goto done; }
    Device *d = &g_dev[dev];
    CUevent ev = NULL;
    if (d->nfree) ev = d->free[--d->nfree];
    else if ((r = cu.EventCreate(&ev, 0)) != CU_OK) { cu_fail(r, "cuEventCreate"); goto done; }
    if ((r = cu.EventRecord(ev, stream)) != CU_OK) { cu.EventDestroy(ev); cu_fail(r, "cuEventRecord"); goto done; }
    *out = ev;
    rc = 1;
done:
    leave_ctx(pushed);
    return rc;
}

/* The device index of a step's dev (an int, or None: the current device), or -1. */
int cuda_device_of(PyObject *dev) {
    PyObject *got = NULL;
    if (dev == NULL || dev == Py_None) {
        if (g_get_device == NULL) { PyErr_SetString(PyExc_RuntimeError, "instrumented_convs: cuda_bind() was not called"); return -1; }
        dev = got = PyObject_CallNoArgs(g_get_device);
        if (got == NULL) return -1;
    }
    long d = PyLong_AsLong(dev);
    Py_XDECREF(got);
    if (d == -1 && PyErr_Occurred()) return -1;
    if (d < 0 || d >= MAX_DEV) { PyErr_Format(PyExc_ValueError, "no CUDA device %ld", d); return -1; }
    return (int)d;
}

/* -- the queue of recorded pairs ------------------------------------------------------- */

typedef struct {
    PyObject *entry, *slot;  /* owned; slot: the call's place on the timeline, or NULL */
    CUevent start, end;
    long long t1, host;  /* the CPU clock at the end event's record, and the host time (ns) */
    int dev;
    char sampled;
} Pair;
static Pair *g_q = NULL;
static Py_ssize_t g_head = 0, g_len = 0, g_cap = 0, g_poll_at = 2048, g_hard_limit = 65536;

static int add_slot(PyObject *entry, Py_ssize_t off, long long v) {
    PyObject *old = SLOT(entry, off);
    long long x = old ? PyLong_AsLongLong(old) : 0;
    if (x == -1 && PyErr_Occurred()) return -1;
    PyObject *n = PyLong_FromLongLong(x + v);
    if (n == NULL) return -1;
    SLOT(entry, off) = n;
    Py_XDECREF(old);
    return 0;
}

/* The lag of a pair's end (ns, >= 0), or -1 where it cannot be read: its device time against
 * the device's reference, less the CPU time it was recorded, from the least such difference in
 * the last LAG_BUCKETS buckets of CPU time (the moment the device was least behind). */
static long long lag_of(Pair *p, int *keep_end) {
    Device *d = &g_dev[p->dev];
    float ms;
    *keep_end = 0;
    if (d->ref == NULL) {  /* the first pair read on this device: its end is the reference */
        d->ref = p->end;
        d->ref_dev = 0.0;
        d->ref_t = p->t1;
        *keep_end = 1;
        ms = 0.0f;
    } else if (cu.EventElapsed(&ms, d->ref, p->end) != CU_OK) {
        return -1;
    }
    double x = d->ref_dev + (double)ms * 1e6 - (double)p->t1;
    long long b = p->t1 / g_bucket_ns;
    int i = (int)(b % LAG_BUCKETS);
    if (d->bucket[i] != b) { d->bucket[i] = b; d->least[i] = x; }
    else if (x < d->least[i]) d->least[i] = x;
    double zero = x;
    for (int k = 0; k < LAG_BUCKETS; k++)
        if (d->bucket[k] > b - LAG_BUCKETS && d->bucket[k] <= b && d->least[k] < zero) zero = d->least[k];
    if (!*keep_end && p->t1 - d->ref_t > g_bucket_ns) {  /* a new reference: float ms stays exact */
        pool_put(p->dev, d->ref);
        d->ref = p->end;
        d->ref_dev += (double)ms * 1e6;
        d->ref_t = p->t1;
        *keep_end = 1;
    }
    return (long long)llround(x - zero);
}

/* Whether a pair of entry has its lag read, a second driver read (as dear as the pair's own
 * in situ): for the entry's first lag_all lags, then where its buffer's length is a multiple
 * of lag_every (one call in lag_every); always where entry is not a plain Entry. The twin,
 * core/clocks/pending.py's lag_wanted, decides the same. */
static int lag_wanted(PyObject *entry) {
    if ((PyObject *)Py_TYPE(entry) != g_entry_type) return 1;
    PyObject *buf = SLOT(entry, o_buf), *dc = SLOT(entry, o_dcalls);
    if (buf == NULL || !PyList_CheckExact(buf) || dc == NULL || !PyLong_CheckExact(dc)) return 1;
    long long d = PyLong_AsLongLong(dc);
    if (d == -1 && PyErr_Occurred()) { PyErr_Clear(); return 1; }
    return d < g_lag_all || PyList_GET_SIZE(buf) % g_lag_every == 0;
}

/* Fold a pair whose own time was read (r: cuEventElapsedTime's answer, ms its time). */
static int fold_pair(Pair *p, CUresult r, float ms) {
    int pushed = enter_ctx(p->dev);
    lap(P_CONTEXT);
    if (pushed < 0) return -1;
    int ok = r == CU_OK, keep_end = 0, rc = -1;
    long long ns = ok ? llround((double)ms * 1e6) : 0, lag = -1;
    if (ok && (g_dev[p->dev].ref == NULL || lag_wanted(p->entry))) lag = lag_of(p, &keep_end);
    lap(P_LAG);
    if (ok && p->slot != NULL) {  /* the call's times on the timeline's GPU track */
        PyObject *ref = PyObject_GetAttr(p->slot, s_ref);
        CUevent rev = ref ? PyLong_AsVoidPtr(ref) : NULL;
        Py_XDECREF(ref);
        float a, b;
        if (rev != NULL && cu.EventElapsed(&a, rev, p->start) == CU_OK && cu.EventElapsed(&b, rev, p->end) == CU_OK) {
            PyObject *fa = PyFloat_FromDouble(a), *fb = PyFloat_FromDouble(b);
            if (!fa || !fb || PyObject_SetAttr(p->slot, s_start_ms, fa) < 0 || PyObject_SetAttr(p->slot, s_end_ms, fb) < 0)
                PyErr_Clear();
            Py_XDECREF(fa); Py_XDECREF(fb);
        }
        PyErr_Clear();
    }
    lap(P_TIMELINE);
    leave_ctx(pushed);
    lap(P_CONTEXT);
    PyObject *entry = p->entry;
    if (ok && !p->sampled && (PyObject *)Py_TYPE(entry) == g_entry_type && SLOT(entry, o_retired) == Py_False
        && SLOT(entry, o_buf) != NULL && PyList_CheckExact(SLOT(entry, o_buf))) {
        PyObject *buf = SLOT(entry, o_buf), *v = PyLong_FromLongLong(ns);
        if (v == NULL || PyList_Append(buf, v) < 0) { Py_XDECREF(v); goto out; }
        Py_DECREF(v);
        if (lag >= 0 && (add_slot(entry, o_host, p->host) < 0 || add_slot(entry, o_dcalls, 1) < 0
                         || add_slot(entry, o_lag, lag) < 0 || add_slot(entry, o_caught, lag < g_lag_floor) < 0))
            goto out;
        lap(P_FOLD_C);
        if (PyList_GET_SIZE(buf) >= g_fold_at) {
            PyObject *r = PyObject_CallMethodObjArgs(g_registry, s_fold, entry, NULL);
            lap(P_FOLD_REGISTRY);
            if (r == NULL) goto out;
            Py_DECREF(r);
        }
        rc = 0;
    } else {  /* sampled, retired, or unreadable: the registry's Python fold */
        PyObject *r = NULL, *nso = ok ? PyLong_FromLongLong(ns) : Py_NewRef(Py_None);
        PyObject *lago = lag >= 0 ? PyLong_FromLongLong(lag) : Py_NewRef(Py_None);
        if (nso && lago)
            r = PyObject_CallFunction(g_fold_device, "OOOLO", entry, nso, p->sampled ? Py_True : Py_False,
                                      p->host, lago);
        Py_XDECREF(nso); Py_XDECREF(lago);
        if (r != NULL) { Py_DECREF(r); rc = 0; }
        lap(P_FOLD_PYTHON);
    }
out:
    if (!ok) {  /* an unreadable pair's events are not reused (the twin drops them too) */
        cu.EventDestroy(p->start);
        cu.EventDestroy(p->end);
        return rc;
    }
    pool_put(p->dev, p->start);
    if (!keep_end) pool_put(p->dev, p->end);
    lap(P_RELEASE);
    return rc;
}

/* Queue a recorded pair (references to entry and slot taken), then poll when poll_at are
 * waiting: 0, or -1 with an exception (the pair is queued all the same). */
int cuda_pend(PyObject *entry, void *start, void *end, int dev, long long t1, long long host,
              int sampled, PyObject *slot) {
    if (g_len == g_cap) {
        Py_ssize_t cap = g_cap ? g_cap * 2 : 1024;
        Pair *q = PyMem_Malloc(cap * sizeof(Pair));
        if (q == NULL) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t i = 0; i < g_len; i++) q[i] = g_q[(g_head + i) % g_cap];
        PyMem_Free(g_q);
        g_q = q;
        g_cap = cap;
        g_head = 0;
    }
    Pair *p = &g_q[(g_head + g_len++) % g_cap];
    p->entry = Py_NewRef(entry);
    p->slot = slot == NULL || slot == Py_None ? NULL : Py_NewRef(slot);
    p->start = start;
    p->end = end;
    p->t1 = t1;
    p->host = host;
    p->dev = dev;
    p->sampled = (char)sampled;
    if (g_len < g_next_poll) return 0;
    if (!g_tally) return cuda_poll_queue() < 0 ? -1 : 0;  /* a count folded is no error */
    long long t0 = now_ns();
    Py_ssize_t n = cuda_poll_queue();
    g_poll_ns += now_ns() - t0;
    return n < 0 ? -1 : 0;
}

/* Wait for events end and start (NULL: none) of device dev with the GIL released, as torch's
 * own event waits do: another thread may record what a stream waits for. The queue may
 * change meanwhile: the caller reads its front again. 0, or -1 with an exception. */
static int wait_for(int dev, CUevent end, CUevent start) {
    int pushed = enter_ctx(dev);
    if (pushed < 0) return -1;
    Py_BEGIN_ALLOW_THREADS
    if (start != NULL) cu.EventSynchronize(start);
    cu.EventSynchronize(end);
    Py_END_ALLOW_THREADS
    leave_ctx(pushed);
    return 0;
}

/* Read the front pair's own time: it is the query too (CUDA_ERROR_NOT_READY until both events
 * have run), so a finished pair costs one driver call less. */
static CUresult read_front(float *ms) {
    Pair *p = &g_q[g_head];
    int pushed = enter_ctx(p->dev);
    if (pushed < 0) { PyErr_Clear(); return -1; }
    CUresult r = cu.EventElapsed(ms, p->start, p->end);
    leave_ctx(pushed);
    return r;
}

/* Take the front pair off the queue and fold it (its references released). */
static int fold_front(CUresult r, float ms) {
    Pair p = g_q[g_head];
    g_head = (g_head + 1) % g_cap;
    g_len--;
    int rc = fold_pair(&p, r, ms);
    Py_DECREF(p.entry);
    Py_XDECREF(p.slot);
    lap(P_RELEASE);
    return rc;
}

/* After a poll the next comes when a quarter of poll_at more pairs wait (at least poll_at,
 * at most hard_limit): a device that is behind is not asked at every step, each asking
 * being a driver call that also submits the work batched so far. */
static void next_poll(void) {
    Py_ssize_t more = g_poll_at / 4 > 1 ? g_poll_at / 4 : 1, at = g_len + more;
    g_next_poll = at < g_poll_at ? g_poll_at : at > g_hard_limit ? g_hard_limit : at;
}

/* Fold the finished pairs at the front (pairs on one stream finish in order: stop at the first
 * that has not), then wait for the oldest while hard_limit are waiting. How many, or -1. */
static Py_ssize_t poll_queue(void);

Py_ssize_t cuda_poll_queue(void) {
    g_lapping = g_tally > 1;
    if (g_lapping) g_lap_t = now_ns();
    Py_ssize_t n = poll_queue();
    g_lapping = 0;
    return n;
}

static Py_ssize_t poll_queue(void) {
    Py_ssize_t folded = 0;
    float ms;
    g_polls++;
    if (g_len) {  /* the newest end first: the driver learns at once how far the device got,
                     and reading each pair it has run costs a quarter (cuda_bench_reads) */
        Pair *back = &g_q[(g_head + g_len - 1) % g_cap];
        int pushed = enter_ctx(back->dev);
        if (pushed < 0) PyErr_Clear();
        else { cu.EventQuery(back->end); leave_ctx(pushed); }
        lap(P_QUERY);
    }
    while (g_len) {
        CUresult r = read_front(&ms);
        lap(P_READ);
        if (r == CU_NOT_READY) { g_unready++; break; }  /* any other answer: fold it now (an error: untimed) */
        if (fold_front(r, ms) < 0) { g_folded += folded; next_poll(); return -1; }
        folded++;
    }
    while (g_len >= g_hard_limit) {
        CUevent end = g_q[g_head].end;
        wait_for(g_q[g_head].dev, end, NULL);  /* this event only, not the whole device */
        lap(P_WAIT);
        g_waits++;
        if (g_len && g_q[g_head].end == end) {  /* else another thread read it meanwhile */
            CUresult r = read_front(&ms);
            lap(P_READ);
            if (fold_front(r, ms) < 0) { g_folded += folded; next_poll(); return -1; }
            folded++;
        }
    }
    g_folded += folded;
    next_poll();
    lap(P_OTHER);
    return folded;
}

static PyObject *py_poll(PyObject *mod, PyObject *unused) {
    if (g_lib == NULL) return PyLong_FromLong(0);
    Py_ssize_t n = cuda_poll_queue();
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *py_drain(PyObject *mod, PyObject *unused) {
    Py_ssize_t n = 0;
    while (g_len) {
        CUevent end = g_q[g_head].end;
        /* the start too: it may sit on another stream */
        if (wait_for(g_q[g_head].dev, end, g_q[g_head].start) < 0) return NULL;
        if (g_len && g_q[g_head].end == end) {  /* else another thread read it meanwhile */
            float ms;
            CUresult r = read_front(&ms);
            if (fold_front(r, ms) < 0) return NULL;
            n++;
        }
    }
    return PyLong_FromSsize_t(n);
}

static PyObject *py_clear(PyObject *mod, PyObject *unused) {
    while (g_len) {  /* forgotten: their events are not read; destroyed, done or not */
        Pair p = g_q[g_head];
        g_head = (g_head + 1) % g_cap;
        g_len--;
        cu.EventDestroy(p.start);
        cu.EventDestroy(p.end);
        Py_DECREF(p.entry);
        Py_XDECREF(p.slot);
    }
    for (int i = 0; i < MAX_DEV; i++) {  /* the lags' zeros start again */
        Device *d = &g_dev[i];
        if (d->ref != NULL) pool_put(i, d->ref);
        d->ref = NULL;
        for (int k = 0; k < LAG_BUCKETS; k++) d->bucket[k] = LLONG_MIN;
    }
    g_next_poll = g_poll_at;
    Py_RETURN_NONE;
}

static PyObject *py_pending(PyObject *mod, PyObject *unused) { return PyLong_FromSsize_t(g_len); }

static PyObject *py_limits(PyObject *mod, PyObject *args) {
    Py_ssize_t poll_at, hard;
    if (!PyArg_ParseTuple(args, "nn", &poll_at, &hard)) return NULL;
    g_poll_at = poll_at < 1 ? 1 : poll_at;
    g_hard_limit = hard < 1 ? 1 : hard;
    g_next_poll = g_poll_at;
    Py_RETURN_NONE;
}

/* -- the Python-facing calls ----------------------------------------------------------- */

static void *sym(const char *a, const char *b) {
#ifndef _WIN32
    void *f = dlsym(g_lib, a);
    if (f == NULL && b != NULL) f = dlsym(g_lib, b);
    return f;
#else
    return NULL;
#endif
}

static PyObject *py_load(PyObject *mod, PyObject *args) {
    const char *path = "libcuda.so.1";
    if (!PyArg_ParseTuple(args, "|z", &path)) return NULL;
    if (path == NULL) path = "libcuda.so.1";
#ifdef _WIN32
    return PyUnicode_FromString("no CUDA driver loading on this platform");
#else
    if (g_len) { PyErr_SetString(PyExc_RuntimeError, "instrumented_convs: CUDA pairs are pending"); return NULL; }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) return PyUnicode_FromFormat("cannot load %s: %s", path, dlerror());
    void *old = g_lib;
    struct CuApi saved = cu;  /* put back if this library will not do */
    g_lib = lib;
    cu.Init = sym("cuInit", NULL);
    cu.DeviceGet = sym("cuDeviceGet", NULL);
    cu.PrimaryCtxRetain = sym("cuDevicePrimaryCtxRetain", NULL);
    cu.CtxGetCurrent = sym("cuCtxGetCurrent", NULL);
    cu.CtxPush = sym("cuCtxPushCurrent_v2", "cuCtxPushCurrent");
    cu.CtxPop = sym("cuCtxPopCurrent_v2", "cuCtxPopCurrent");
    cu.EventCreate = sym("cuEventCreate", NULL);
    cu.EventRecord = sym("cuEventRecord", NULL);
    cu.EventQuery = sym("cuEventQuery", NULL);
    cu.EventSynchronize = sym("cuEventSynchronize", NULL);
    cu.EventElapsed = sym("cuEventElapsedTime", "cuEventElapsedTime_v2");
    cu.EventDestroy = sym("cuEventDestroy_v2", "cuEventDestroy");
    cu.StreamIsCapturing = sym("cuStreamIsCapturing", NULL);
    void **f = (void **)&cu;
    for (size_t i = 0; i < sizeof(cu) / sizeof(void *); i++)
        if (f[i] == NULL) {
            cu = saved;
            g_lib = old;
            dlclose(lib);
            return PyUnicode_FromFormat("%s lacks a CUDA driver function (number %d)", path, (int)i);
        }
    CUresult r = cu.Init(0);
    if (r != CU_OK) {
        cu = saved;
        g_lib = old;
        dlclose(lib);  /* drops this reference only: an old load of the same library stays */
        return PyUnicode_FromFormat("cuInit failed (error %d)", r);
    }
    /* a new driver: nothing of the old one is kept (its events belonged to it) */
    for (int i = 0; i < MAX_DEV; i++) {
        Device *d = &g_dev[i];
        free(d->free);
        memset(d, 0, sizeof(*d));
        for (int k = 0; k < LAG_BUCKETS; k++) d->bucket[k] = LLONG_MIN;
    }
    Py_RETURN_NONE;
#endif
}

static PyObject *py_bind(PyObject *mod, PyObject *args) {
    PyObject *get_device, *raw_stream, *fold_device, *entry_type;
    if (!PyArg_ParseTuple(args, "OOOO", &get_device, &raw_stream, &fold_device, &entry_type)) return NULL;
    if ((o_host = slot_offset(entry_type, "host")) < 0 || (o_dcalls = slot_offset(entry_type, "dcalls")) < 0
        || (o_lag = slot_offset(entry_type, "lag")) < 0 || (o_caught = slot_offset(entry_type, "caught")) < 0)
        return NULL;
    Py_XSETREF(g_get_device, Py_NewRef(get_device));
    Py_XSETREF(g_raw_stream, Py_NewRef(raw_stream));
    Py_XSETREF(g_fold_device, Py_NewRef(fold_device));
    if (s_start_ms == NULL) {
        s_start_ms = PyUnicode_InternFromString("start_ms");
        s_end_ms = PyUnicode_InternFromString("end_ms");
        s_ref = PyUnicode_InternFromString("ref");
        if (!s_start_ms || !s_end_ms || !s_ref) return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_native(PyObject *mod, PyObject *on) {
    int r = PyObject_IsTrue(on);
    if (r < 0) return NULL;
    if (r && (g_lib == NULL || g_get_device == NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "instrumented_convs: cuda_load() and cuda_bind() first");
        return NULL;
    }
    g_cuda_native = r;
    Py_RETURN_NONE;
}

static PyObject *py_record(PyObject *mod, PyObject *arg) {
    int dev = PyLong_AsLong(arg);
    if (dev == -1 && PyErr_Occurred()) return NULL;
    CUevent ev = NULL;
    int r = cuda_record_now(dev, &ev);
    if (r < 0) return NULL;
    if (r == 0) Py_RETURN_NONE;
    return PyLong_FromVoidPtr(ev);
}

static CUevent as_event(PyObject *o) {
    CUevent ev = PyLong_AsVoidPtr(o);
    if (ev == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a CUDA event handle, not 0");
    return ev;
}

static PyObject *py_pend(PyObject *mod, PyObject *args) {
    PyObject *entry, *start, *end, *slot = Py_None;
    int dev, sampled = 0;
    long long t1, host;
    if (!PyArg_ParseTuple(args, "OOOiLL|pO", &entry, &start, &end, &dev, &t1, &host, &sampled, &slot)) return NULL;
    if (check_bound(dev) < 0) return NULL;
    CUevent s = as_event(start), e = s ? as_event(end) : NULL;
    if (e == NULL) return NULL;
    if (cuda_pend(entry, s, e, dev, t1, host, sampled, slot) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_put(PyObject *mod, PyObject *args) {
    int dev;
    PyObject *h;
    if (!PyArg_ParseTuple(args, "iO", &dev, &h) || check_dev(dev) < 0) return NULL;
    CUevent ev = as_event(h);
    if (ev == NULL) return NULL;
    pool_put(dev, ev);
    Py_RETURN_NONE;
}

static PyObject *py_available(PyObject *mod, PyObject *arg) {
    int dev = PyLong_AsLong(arg);
    if ((dev == -1 && PyErr_Occurred()) || check_dev(dev) < 0) return NULL;
    return PyLong_FromSsize_t(g_dev[dev].nfree);
}

static PyObject *py_query(PyObject *mod, PyObject *arg) {
    if (g_lib == NULL) return PyErr_Format(PyExc_RuntimeError, "instrumented_convs: cuda_load() was not called");
    CUevent ev = as_event(arg);
    if (ev == NULL) return NULL;
    CUresult r = cu.EventQuery(ev);
    if (r == CU_OK) Py_RETURN_TRUE;
    if (r == CU_NOT_READY) Py_RETURN_FALSE;
    cu_fail(r, "cuEventQuery");
    return NULL;
}

static PyObject *py_elapsed(PyObject *mod, PyObject *args) {
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO", &a, &b)) return NULL;
    if (g_lib == NULL) return PyErr_Format(PyExc_RuntimeError, "instrumented_convs: cuda_load() was not called");
    CUevent s = as_event(a), e = s ? as_event(b) : NULL;
    if (e == NULL) return NULL;
    float ms;
    CUresult r = cu.EventElapsed(&ms, s, e);
    if (r != CU_OK) { cu_fail(r, "cuEventElapsedTime"); return NULL; }
    return PyFloat_FromDouble(ms);
}

static PyObject *py_lag_floor(PyObject *mod, PyObject *args) {
    long long floor_ns, bucket_ns;
    long long all = g_lag_all, every = g_lag_every;
    if (!PyArg_ParseTuple(args, "LL|LL", &floor_ns, &bucket_ns, &all, &every)) return NULL;
    g_lag_floor = floor_ns;
    g_bucket_ns = bucket_ns > 0 ? bucket_ns : 1;
    g_lag_all = all;
    g_lag_every = every > 0 ? every : 1;
    Py_RETURN_NONE;
}

/* What the queue did since the last call (benchmarks/cuda_step.py), then its counts zeroed:
 * on (optional) also times each record and poll from here on (two clock reads each). */
static PyObject *py_tally(PyObject *mod, PyObject *args) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|i", &on)) return NULL;
    PyObject *d = Py_BuildValue("{sLsLsLsLsLsLsL}", "polls", g_polls, "unready", g_unready, "folded", g_folded,
                                "waits", g_waits, "records", g_records, "record_ns", g_record_ns,
                                "poll_ns", g_poll_ns);
    PyObject *parts = d ? PyDict_New() : NULL;
    for (int i = 0; parts != NULL && i < N_PARTS; i++) {
        PyObject *v = PyLong_FromLongLong(g_part_ns[i]);
        if (v == NULL || PyDict_SetItemString(parts, g_part_names[i], v) < 0) Py_CLEAR(parts);
        Py_XDECREF(v);
        g_part_ns[i] = 0;
    }
    if (parts == NULL || PyDict_SetItemString(d, "poll_parts_ns", parts) < 0) { Py_XDECREF(parts); Py_XDECREF(d); return NULL; }
    Py_DECREF(parts);
    g_polls = g_unready = g_folded = g_waits = g_records = g_record_ns = g_poll_ns = 0;
    if (on >= 0) g_tally = on < 0 ? 0 : on > 2 ? 2 : on;
    return d;
}

/* What the raw records cost alone (benchmarks/cuda_step.py): n events of device dev's pool
 * recorded on its current stream, as a step records them, in ns per record. */
static PyObject *py_bench_records(PyObject *mod, PyObject *args) {
    int dev;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "in", &dev, &n) || check_bound(dev) < 0) return NULL;
    CUevent ev = NULL;
    CUstream stream;
    if (cuda_record_now(dev, &ev) < 0 || raw_stream_of(dev, &stream) < 0) return NULL;  /* warm */
    long long t0 = now_ns();
    for (Py_ssize_t i = 0; i < n; i++) cu.EventRecord(ev, stream);
    long long t1 = now_ns();
    cu.EventSynchronize(ev);
    pool_put(dev, ev);
    return PyFloat_FromDouble(n ? (double)(t1 - t0) / (double)n : 0.0);
}

/* What each call of a CUDA step costs from C, in ns a call over n calls (benchmarks/cuda_step.py):
 * the driver's (record, capture query, current context, query, elapsed time, create and
 * destroy) and torch's two readers called from here (the current device, the raw stream). */
static PyObject *py_bench_parts(PyObject *mod, PyObject *args) {
    int dev;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "in", &dev, &n) || check_bound(dev) < 0 || n < 1) return NULL;
    CUevent a = NULL, b = NULL;
    if (cuda_record_now(dev, &a) < 0 || cuda_record_now(dev, &b) < 0) return NULL;
    PyObject *idx = PyLong_FromLong(dev);
    PyObject *so = idx ? PyObject_CallOneArg(g_raw_stream, idx) : NULL;
    if (so == NULL) { Py_XDECREF(idx); return NULL; }
    CUstream stream = PyLong_AsVoidPtr(so);
    Py_DECREF(so);
    int pushed = enter_ctx(dev);
    if (pushed < 0) { Py_DECREF(idx); return NULL; }
    cu.EventSynchronize(b);
    double t[8];
    long long t0;
    int capturing;
    CUcontext cur;
    float ms;
    CUevent e;
#define TIME(i, body) t0 = now_ns(); for (Py_ssize_t k = 0; k < n; k++) { body; } t[i] = (double)(now_ns() - t0) / (double)n
    TIME(0, cu.EventRecord(a, stream));
    cu.EventSynchronize(a);
    TIME(1, cu.StreamIsCapturing(stream, &capturing));
    TIME(2, cu.CtxGetCurrent(&cur));
    TIME(3, cu.EventQuery(a));
    TIME(4, cu.EventElapsed(&ms, b, a));
    TIME(5, cu.EventCreate(&e, 0); cu.EventDestroy(e));
    TIME(6, Py_XDECREF(PyObject_CallNoArgs(g_get_device)));
    TIME(7, Py_XDECREF(PyObject_CallOneArg(g_raw_stream, idx)));
#undef TIME
    leave_ctx(pushed);
    Py_DECREF(idx);
    pool_put(dev, a);
    pool_put(dev, b);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("{sdsdsdsdsdsdsdsd}", "cuEventRecord", t[0], "cuStreamIsCapturing", t[1],
                         "cuCtxGetCurrent", t[2], "cuEventQuery", t[3], "cuEventElapsedTime", t[4],
                         "cuEventCreate+cuEventDestroy", t[5], "get_device()", t[6], "raw_stream(dev)", t[7]);
}

/* What reading recorded pairs costs from C (benchmarks/cuda_step.py), in ns a pair: n pairs
 * recorded back to back after a reference event, the device left settle_ms to run them (no
 * driver call meanwhile), then each pair read as the queue reads it (its own time, then its
 * end against the reference) twice over; first with nothing asked before, then after a query
 * of the newest end, then after a wait for it. Each round's reads that were not ready count. */
static PyObject *py_bench_reads(PyObject *mod, PyObject *args) {
    int dev;
    Py_ssize_t n;
    double settle_ms;
    CUstream stream;
    if (!PyArg_ParseTuple(args, "ind", &dev, &n, &settle_ms) || check_bound(dev) < 0 || n < 1
        || raw_stream_of(dev, &stream) < 0)
        return NULL;
    CUevent *ev = calloc((size_t)(2 * n + 1), sizeof(CUevent));
    if (ev == NULL) return PyErr_NoMemory();
    int pushed = enter_ctx(dev);
    if (pushed < 0) { free(ev); return NULL; }
    PyObject *out = PyDict_New();
    Py_ssize_t made = 0;
    for (; out != NULL && made < 2 * n + 1; made++)
        if (cu.EventCreate(&ev[made], 0) != CU_OK) { cu_fail(-1, "cuEventCreate"); Py_CLEAR(out); }
    static const char *names[] = {"nothing asked before", "after a query of the newest end", "after a wait for it"};
    for (int mode = 0; out != NULL && mode < 3; mode++) {
        CUevent ref = ev[2 * n], newest = ev[2 * n - 1];
        cu.EventRecord(ref, stream);
        for (Py_ssize_t i = 0; i < 2 * n; i++) cu.EventRecord(ev[i], stream);
#ifndef _WIN32
        Py_BEGIN_ALLOW_THREADS
        struct timespec ts = {(time_t)(settle_ms / 1000), (long)(fmod(settle_ms, 1000.0) * 1e6)};
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
#endif
        if (mode == 1) cu.EventQuery(newest);
        if (mode == 2) cu.EventSynchronize(newest);
        double t[2];
        long long unready = 0;
        float ms;
        for (int pass = 0; pass < 2; pass++) {
            long long t0 = now_ns();
            for (Py_ssize_t i = 0; i < n; i++) {
                unready += cu.EventElapsed(&ms, ev[2 * i], ev[2 * i + 1]) != CU_OK;
                unready += cu.EventElapsed(&ms, ref, ev[2 * i + 1]) != CU_OK;
            }
            t[pass] = (double)(now_ns() - t0) / (double)n;
        }
        cu.EventSynchronize(newest);
        PyObject *v = Py_BuildValue("{sdsdsL}", "first read", t[0], "second read", t[1], "not ready", unready);
        if (v == NULL || PyDict_SetItemString(out, names[mode], v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    for (Py_ssize_t i = 0; i < made; i++) cu.EventDestroy(ev[i]);
    free(ev);
    leave_ctx(pushed);
    return out;
}

PyMethodDef cuda_methods[] = {
    {"cuda_load", py_load, METH_VARARGS, "Load the CUDA driver (a path, default libcuda.so.1): None, or why not."},
    {"cuda_bind", py_bind, METH_VARARGS, "Hand over get_device(), raw_stream(dev), fold_device(...) and Entry."},
    {"cuda_native", py_native, METH_O, "Whether StepBase times CUDA steps in C (cuda_load/cuda_bind first)."},
    {"cuda_record", py_record, METH_O, "An event of dev's pool recorded on its current stream (None: capturing)."},
    {"cuda_bench_parts", py_bench_parts, METH_VARARGS, "ns a call of each CUDA call a step makes, from C."},
    {"cuda_pend", py_pend, METH_VARARGS, "Queue (entry, start, end, dev, t1, host[, sampled, slot]) to be read lazily."},
    {"cuda_poll", py_poll, METH_NOARGS, "Fold the finished pairs at the queue's front: how many."},
    {"cuda_drain", py_drain, METH_NOARGS, "Wait for every queued pair and fold it: how many."},
    {"cuda_clear", py_clear, METH_NOARGS, "Forget every queued pair."},
    {"cuda_pending", py_pending, METH_NOARGS, "How many pairs are queued."},
    {"cuda_limits", py_limits, METH_VARARGS, "Set the queue's poll_at and hard_limit."},
    {"cuda_put", py_put, METH_VARARGS, "Give event handle h back to device dev's pool."},
    {"cuda_available", py_available, METH_O, "How many unused events device dev's pool holds."},
    {"cuda_query", py_query, METH_O, "Whether an event has completed."},
    {"cuda_elapsed", py_elapsed, METH_VARARGS, "Milliseconds from event a to event b."},
    {"cuda_lag_floor", py_lag_floor, METH_VARARGS, "Set the lag's floor and the zero's bucket, in ns; [the lags read in full, then one in N]."},
    {"cuda_tally", py_tally, METH_VARARGS, "What the queue did since the last call ([on]: 1 times records and polls, 2 their parts too)."},
    {"cuda_bench_reads", py_bench_reads, METH_VARARGS, "ns a pair read (its time, its lag) in three settings."},
    {"cuda_bench_records", py_bench_records, METH_VARARGS, "ns per raw event record on dev's current stream."},
    {NULL},
};
