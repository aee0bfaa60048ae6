/* Declarations shared by the parts of the C fast path of steps (instrumented_convs.core.native._speedups):
 *   _speedups.c        the module: bind(), the clock, the per-thread stack, folding sums;
 *   _speedups_step.c   Frame and StepBase (the fast __enter__/__exit__ of a step);
 *   _speedups_timed.c  Timed (a callable run inside a step) and installing it on instances;
 *   _speedups_anchor.c anchors: their logs, and their exit (choosing how the backward is
 *                      timed, counting it);
 *   _speedups_count.c  CountHook, the hook that counts a backward not timed;
 *   _speedups_hook.c   BackwardHook, the hooks of a timed backward step's nodes;
 *   _speedups_cuda.c   the CUDA clock: the driver loaded at run time, event pools, the queue
 *                      of recorded pairs and their host time and lag.
 * The Python twins: TWINS in instrumented_convs/core/native/__init__.py.
 */
#ifndef INSTRUMENTED_CONVS_SPEEDUPS_H
#define INSTRUMENTED_CONVS_SPEEDUPS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#if PY_VERSION_HEX < 0x030A0000  /* Python 3.9 */
static inline PyObject *Py_NewRef(PyObject *o) { Py_INCREF(o); return o; }
static inline PyObject *Py_XNewRef(PyObject *o) { Py_XINCREF(o); return o; }
#endif

enum { CPU = 0, CUDA = 1, UNTIMED = 2, BOTTOM = 3 };
/* Frame.flags bits (core.frames.stack): an NVTX range open; a frame of the ranges mode. */
enum { PUSHED = 1, RANGED = 8 };

typedef struct {
    PyObject_HEAD
    PyObject *entry, *rf, *owner, *dev, *spare, *log, *outputs, *task;
    PyObject *event;  /* a CUDA frame's start event as Python made it (twin), else NULL */
    void *cu_start;  /* a CUDA frame's start event as the C clock recorded it, else NULL */
    PyObject *gpu;  /* a CUDA frame's GPU slot on the timeline (a clocks.events.GpuSlot), else NULL */
    int mode, flags;
    int event_device;  /* the device the start event was recorded on: its pool's key */
    char cuda, anchor;
    char has_t0;  /* the C enter set t0 (its exit may be C's); a Python write of start clears it */
    long long seq0;
    long long t0;  /* start: the CPU clock at a CPU or CUDA frame's entry, in ns */
    PyObject *start_obj;  /* start as Python set it (an int, read back as is), else NULL */
    long long own;  /* the tool's own time (see backward.hooks): the bottom's total, a frame's at its start */
    long long opened;  /* the bottom's: steps opened on this thread (the duty cycle reads it) */
} Frame;

typedef struct {
    PyObject_HEAD
    PyObject *name, *scope, *cuda, *dev, *kind, *key;
    char region;
} StepBase;

extern PyTypeObject FrameType, StepBaseType, TimedType, CountHookType, BackwardHookType;

/* What bind() hands over (_speedups.c). */
extern PyObject *g_config, *g_prof, *g_registry, *g_seq, *g_grad_enabled;
extern PyObject *g_perf_counter_ns, *g_entry_type, *g_log_type, *g_log_exit;
extern Py_ssize_t g_fold_at;
extern int g_nvtx_live;  /* set_nvtx_live(): whether NVTX ranges are pushed */
/* the backend's push(name, scope, region) and pop() when the fast path pushes them, else NULL */
extern PyObject *g_nvtx_push, *g_nvtx_pop;
/* the backend's timed(ns) (the mark of a step's time its range closes with), and the least ns
 * a range must hold beyond the clock for one (set_nvtx_live) */
extern PyObject *g_nvtx_timed;
extern long long g_timed_floor;
extern PyObject *g_timeline;  /* set_timeline(): the timeline's list while it records, else NULL */
/* Offsets of the slots of entry.Entry and anchor.Log read here (see slot_offset). */
extern Py_ssize_t o_retired, o_children, o_buf, o_seq0, o_depth0, o_items, o_outputs, o_scope;
#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))
/* Interned names (PyInit__speedups). */
extern PyObject *s_root, *s_backward, *s_prof_on, *s_fold, *s_enter, *s_exit, *s_forward, *s_ranges;

/* _speedups.c */
int module_flag(PyObject *mod, PyObject *name);
long long now_ns(void);
long long seq_nr(void);
Py_ssize_t slot_offset(PyObject *cls, const char *name);
PyObject *thread_stack(void);
int timeline_add(PyObject *entry, long long t0, long long t1, long long link);
/* _speedups_step.c */
PyObject *StepBase_enter(StepBase *self, PyObject *unused);
PyObject *StepBase_exit(StepBase *self, PyObject *const *args, Py_ssize_t nargs);
/* _speedups_timed.c */
PyObject *time_methods(PyObject *mod, PyObject *args);
PyObject *time_children(PyObject *mod, PyObject *args);
PyObject *restore(PyObject *mod, PyObject *undo);
/* _speedups_anchor.c */
PyObject *new_anchor_log(long long seq0, Py_ssize_t depth0);
int log_inner(Frame *frame, Py_ssize_t depth, PyObject *entry);
PyObject *bind_anchor(PyObject *mod, PyObject *args);
int anchor_exit(Frame *frame, PyObject *stack, PyObject *entry);
/* _speedups_count.c */
PyObject *bind_count(PyObject *mod, PyObject *args);
/* _speedups_cuda.c */
extern int g_cuda_native;  /* cuda_native(): StepBase times CUDA steps in C */
extern PyMethodDef cuda_methods[];
int cuda_record_now(int dev, void **out);
int cuda_pend(PyObject *entry, void *start, void *end, int dev, long long t1, long long host,
              int sampled, PyObject *slot);
Py_ssize_t cuda_poll_queue(void);
void cuda_put_event(int dev, void *ev);
int cuda_device_of(PyObject *dev);

#endif
