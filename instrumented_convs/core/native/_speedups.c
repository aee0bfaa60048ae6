/* The common case of a step, in C: see instrumented_convs/core/steps/step.py (the same path in Python).
 * This file is the module; the parts are listed in _speedups.h.
 *
 * Frame: the frame of an open step (frames.stack.Frame), its attributes as C fields.
 * StepBase: the base of steps.step.Step; its __enter__/__exit__ handle, without a Python frame,
 * a step nested in a CPU forward step, with no NVTX range, no profiler label, no exception,
 * logging its autograd node range when its anchor asks; every other case calls the Python
 * methods Step._enter / Step._exit, which are the general implementation.
 * bind(...) hands over the Python objects this code reads (switches, clock, registry).
 */
#include "_speedups.h"  /* Python.h first, as CPython asks */

#include <limits.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030A0000  /* Python 3.9 */
static int PyModule_AddObjectRef(PyObject *m, const char *name, PyObject *o) {
    Py_INCREF(o);
    if (PyModule_AddObject(m, name, o) < 0) { Py_DECREF(o); return -1; }
    return 0;
}
#endif

PyObject *g_config, *g_prof, *g_registry, *g_seq, *g_grad_enabled;
PyObject *g_perf_counter_ns, *g_entry_type, *g_log_type, *g_log_exit;
Py_ssize_t g_fold_at = 64;
int g_nvtx_live = 1;
PyObject *g_nvtx_push = NULL, *g_nvtx_pop = NULL, *g_nvtx_timed = NULL;
long long g_timed_floor = 0;
PyObject *g_timeline = NULL;
static PyObject *g_timeline_full = NULL;
static Py_ssize_t g_timeline_limit = 0;
Py_ssize_t o_retired, o_children, o_buf, o_seq0, o_depth0, o_items, o_outputs, o_scope;
PyObject *s_root, *s_backward, *s_prof_on, *s_fold, *s_enter, *s_exit, *s_forward, *s_ranges;

static int truthy_attr(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* A module's global, truthy or not (the module's dict, no attribute machinery): -1 on error. */
int module_flag(PyObject *mod, PyObject *name) {
    PyObject *d = PyModule_Check(mod) ? PyModule_GetDict(mod) : NULL;
    if (d == NULL) return truthy_attr(mod, name);
    PyObject *v = PyDict_GetItemWithError(d, name);  /* borrowed */
    if (v == NULL) {
        if (PyErr_Occurred()) return -1;
        return truthy_attr(mod, name);
    }
    return PyObject_IsTrue(v);
}

/* The CPU clock, clocks.cpu.cpu_now: handed to bind(), then told by clocks.cpu.set_cpu_clock()
 * through set_clock(). */
static PyObject *g_cpu_clock = NULL;

/* The CPU clock (clocks.cpu.cpu_now, replaceable by tests), in ns; -1 and an exception on error.
 * When it is time.perf_counter_ns, read the same clock directly: on Linux, CLOCK_MONOTONIC. */
long long now_ns(void) {
    PyObject *fn = g_cpu_clock;  /* borrowed */
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_speedups.bind() was not called");
        return -1;
    }
#ifdef __linux__
    if (fn == g_perf_counter_ns) {
        struct timespec ts;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0) return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
#endif
    PyObject *v = PyObject_CallNoArgs(fn);
    if (v == NULL) return -1;
    long long t = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return t;
}

/* The offset of slot ``name`` of the class ``cls`` (a member descriptor), or -1. */
Py_ssize_t slot_offset(PyObject *cls, const char *name) {
    PyObject *d = PyObject_GetAttrString(cls, name);
    Py_ssize_t off = -1;
    if (d != NULL && Py_TYPE(d) == &PyMemberDescr_Type) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX || m->type == T_OBJECT) off = m->offset;
    }
    Py_XDECREF(d);
    PyErr_Clear();
    return off;
}

/* ATen's at::sequence_number::peek(), the C++ function behind g_seq, when set_seq_native()
 * was given its address (checked in Python to agree with g_seq): no Python call then. */
static unsigned long long (*g_seq_native)(void) = NULL;

long long seq_nr(void) {
    if (g_seq_native != NULL) return (long long)g_seq_native();
    PyObject *v = PyObject_CallNoArgs(g_seq);
    if (v == NULL) return -1;
    long long s = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return s;
}

/* -- the per-thread stack ------------------------------------------------------------------ */

static PyObject *s_tls_key;

/* The stack last found, and the id of its thread (ids are never reused, addresses are): a
 * strong reference, so a dead thread's stack lives until another thread asks for its own. */
static unsigned long long g_last_thread = 0;
static PyObject *g_last_stack = NULL;

/* This thread's stack of frames (borrowed), made with its bottom sentinel on first use; it
 * lives in the thread state's dict, as threading.local's data does, and dies with it. The
 * thread's id is compared first: the dictionary is read when the thread is not the last one. */
PyObject *thread_stack(void) {
    unsigned long long id = PyThreadState_GetID(PyThreadState_Get());
    if (g_last_stack != NULL && id == g_last_thread) return g_last_stack;
    PyObject *d = PyThreadState_GetDict();  /* borrowed */
    if (d == NULL) { PyErr_SetString(PyExc_RuntimeError, "no thread state dict"); return NULL; }
    PyObject *stack = PyDict_GetItemWithError(d, s_tls_key);
    if (stack == NULL) {
        if (PyErr_Occurred()) return NULL;
        PyObject *bottom = PyObject_CallNoArgs((PyObject *)&FrameType);
        if (bottom == NULL) return NULL;
        stack = PyList_New(1);
        if (stack == NULL) { Py_DECREF(bottom); return NULL; }
        PyList_SET_ITEM(stack, 0, bottom);
        int rc = PyDict_SetItem(d, s_tls_key, stack);
        Py_DECREF(stack);
        if (rc < 0) return NULL;
    }
    g_last_thread = id;
    Py_XSETREF(g_last_stack, Py_NewRef(stack));  /* may free a dead thread's stack: state set first */
    return stack;
}

typedef struct { PyObject_HEAD } ThreadState;

static PyObject *ThreadState_stack(PyObject *self, void *closure) {
    PyObject *stack = thread_stack();
    return stack ? Py_NewRef(stack) : NULL;
}

static PyGetSetDef ThreadState_getset[] = {
    {"stack", ThreadState_stack, NULL, "This thread's stack of open frames, bottom sentinel first.", NULL},
    {NULL},
};

static PyTypeObject ThreadStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrumented_convs.core.native._speedups.ThreadState",
    .tp_doc = "Per-thread state: ``stack``, this thread's frames (see instrumented_convs.core.frames.stack).",
    .tp_basicsize = sizeof(ThreadState),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_getset = ThreadState_getset,
};

/* -- folding an entry's buffer ------------------------------------------------------------ */

#ifdef __SIZEOF_INT128__
/* A Python int of a sum of squares (unsigned, up to 128 bits), or NULL with an exception. */
static PyObject *int_of_u128(unsigned __int128 v) {
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(v >> 64));
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)v);
    PyObject *shift = PyLong_FromLong(64), *tmp = NULL, *out = NULL;
    if (hi && lo && shift && (tmp = PyNumber_Lshift(hi, shift)) != NULL) out = PyNumber_Or(tmp, lo);
    Py_XDECREF(hi); Py_XDECREF(lo); Py_XDECREF(shift); Py_XDECREF(tmp);
    return out;
}
#endif

/* sums(buf, n, kinds): for each name in the tuple kinds, that reduction of the first n ints
 * of the list buf: "sum", "sumsq" (the sum of squares), "min" or "max", and None for a name
 * it does not know (entry.fold_buffer makes that one in Python: a new reduction needs no C
 * here); or None when one of them is not an int of 64 bits or their sum is not (then Python
 * folds them all). One pass over buf makes the four; only those asked become Python ints. */
static PyObject *sums(PyObject *mod, PyObject *args) {
    PyObject *buf, *kinds;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!nO!", &PyList_Type, &buf, &n, &PyTuple_Type, &kinds)) return NULL;
#ifdef __SIZEOF_INT128__
    if (n <= 0 || n > PyList_GET_SIZE(buf)) Py_RETURN_NONE;
    __int128 total = 0;
    unsigned __int128 sq = 0;
    long long lo = 0, hi = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(buf, i);
        if (!PyLong_CheckExact(v)) Py_RETURN_NONE;
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); Py_RETURN_NONE; }
        if (i == 0 || x < lo) lo = x;
        if (i == 0 || x > hi) hi = x;
        total += x;
        sq += (unsigned __int128)((__int128)x * x);
    }
    if (total < LLONG_MIN || total > LLONG_MAX) Py_RETURN_NONE;
    static const char *known[4] = {"sum", "sumsq", "min", "max"};
    static PyObject *names[4];  /* the known names, interned: a kind is found by its address */
    for (int i = 0; i < 4; i++)
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(known[i])) == NULL) return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(kinds);
    PyObject *res = PyTuple_New(k);
    if (res == NULL) return NULL;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *name = PyTuple_GET_ITEM(kinds, j), *v;
        int which = 0;
        while (which < 4 && name != names[which]) which++;
        if (which == 4 && PyUnicode_Check(name))  /* a name not interned: by its text */
            for (which = 0; which < 4 && PyUnicode_CompareWithASCIIString(name, known[which]); which++) {}
        switch (which) {
            case 0: v = PyLong_FromLongLong((long long)total); break;
            case 1: v = int_of_u128(sq); break;
            case 2: v = PyLong_FromLongLong(lo); break;
            case 3: v = PyLong_FromLongLong(hi); break;
            default: v = Py_NewRef(Py_None);  /* not known here: Python makes it */
        }
        if (v == NULL) { Py_DECREF(res); return NULL; }
        PyTuple_SET_ITEM(res, j, v);
    }
    return res;
#else
    Py_RETURN_NONE;
#endif
}

/* -- module ------------------------------------------------------------------------------- */

static PyObject *bind(PyObject *mod, PyObject *args) {
    PyObject *config, *prof, *registry, *seq, *cpu_now, *grad_enabled, *entry_t, *log_t, *pc, *log_exit;
    Py_ssize_t fold_at;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOn", &config, &prof, &registry, &seq, &cpu_now, &grad_enabled,
                          &entry_t, &log_t, &pc, &log_exit, &fold_at))
        return NULL;
    Py_XSETREF(g_log_exit, Py_NewRef(log_exit));
    if (!PyCallable_Check(cpu_now)) { PyErr_SetString(PyExc_TypeError, "cpu_now: a callable"); return NULL; }
    o_retired = slot_offset(entry_t, "retired"); o_children = slot_offset(entry_t, "children");
    o_buf = slot_offset(entry_t, "buf"); o_seq0 = slot_offset(log_t, "seq0");
    o_depth0 = slot_offset(log_t, "depth0"); o_items = slot_offset(log_t, "items");
    o_outputs = slot_offset(log_t, "outputs"); o_scope = slot_offset(entry_t, "scope");
    if (o_retired < 0 || o_children < 0 || o_buf < 0 || o_seq0 < 0 || o_depth0 < 0 || o_items < 0 || o_outputs < 0
        || o_scope < 0) {
        PyErr_SetString(PyExc_TypeError, "Entry and Log must be classes with __slots__ (see _speedups.c)");
        return NULL;
    }
    Py_XSETREF(g_entry_type, Py_NewRef(entry_t)); Py_XSETREF(g_log_type, Py_NewRef(log_t));
    Py_XSETREF(g_perf_counter_ns, Py_NewRef(pc));
    Py_XSETREF(g_config, Py_NewRef(config)); Py_XSETREF(g_prof, Py_NewRef(prof));
    Py_XSETREF(g_registry, Py_NewRef(registry)); Py_XSETREF(g_seq, Py_NewRef(seq));
    Py_XSETREF(g_cpu_clock, Py_NewRef(cpu_now)); Py_XSETREF(g_grad_enabled, Py_NewRef(grad_enabled));
    g_fold_at = fold_at;
    Py_RETURN_NONE;
}

static PyObject *set_seq_native(PyObject *mod, PyObject *arg) {
    if (arg == Py_None) { g_seq_native = NULL; Py_RETURN_NONE; }
    void *p = PyLong_AsVoidPtr(arg);
    if (p == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "set_seq_native: a non-zero address or None");
        return NULL;
    }
    g_seq_native = (unsigned long long (*)(void))p;
    Py_RETURN_NONE;
}

static PyObject *read_seq(PyObject *mod, PyObject *unused) {
    long long s = seq_nr();
    if (s == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(s);
}

static PyObject *seq_is_native(PyObject *mod, PyObject *unused) {
    return PyBool_FromLong(g_seq_native != NULL);
}

static PyObject *set_clock(PyObject *mod, PyObject *fn) {
    if (!PyCallable_Check(fn)) { PyErr_SetString(PyExc_TypeError, "set_clock: a callable"); return NULL; }
    Py_XSETREF(g_cpu_clock, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* set_nvtx_live(live[, push, pop[, timed, floor]]): whether NVTX ranges are pushed, and the
 * backend's calls for the fast path to push them itself (without them a step that pushes takes
 * Python's); timed(ns): the mark of the step's time a range closes with when it holds at least
 * floor ns more than the step's clock took (frames.lifecycle.close_frame's twin). */
static PyObject *set_nvtx_live(PyObject *mod, PyObject *args) {
    PyObject *live, *push = Py_None, *pop = Py_None, *timed = Py_None;
    long long floor = 0;
    if (!PyArg_ParseTuple(args, "O|OOOL", &live, &push, &pop, &timed, &floor)) return NULL;
    int r = PyObject_IsTrue(live);
    if (r < 0) return NULL;
    int calls = r && push != Py_None && pop != Py_None;
    Py_XSETREF(g_nvtx_push, calls ? Py_NewRef(push) : NULL);
    Py_XSETREF(g_nvtx_pop, calls ? Py_NewRef(pop) : NULL);
    Py_XSETREF(g_nvtx_timed, calls && timed != Py_None ? Py_NewRef(timed) : NULL);
    g_timed_floor = floor;
    g_nvtx_live = r;
    Py_RETURN_NONE;
}

/* set_timeline(events, limit, full): append (entry, t0, t1, thread, link) to the list events
 * at each fast exit while it holds fewer than limit; at the limit call full() instead (which
 * stops it). events None: off. See instrumented_convs/core/storage/timeline.py. */
static PyObject *set_timeline(PyObject *mod, PyObject *args) {
    PyObject *events, *full;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OnO", &events, &limit, &full)) return NULL;
    if (events != Py_None && !PyList_CheckExact(events)) {
        PyErr_SetString(PyExc_TypeError, "set_timeline: a list or None");
        return NULL;
    }
    Py_XSETREF(g_timeline_full, Py_NewRef(full));
    g_timeline_limit = limit;
    Py_XSETREF(g_timeline, events == Py_None ? NULL : Py_NewRef(events));
    Py_RETURN_NONE;
}

/* One call on the timeline (g_timeline not NULL): 0, or -1 with an exception. */
int timeline_add(PyObject *entry, long long t0, long long t1, long long link) {
    PyObject *events = Py_NewRef(g_timeline);
    int rc;
    if (PyList_GET_SIZE(events) >= g_timeline_limit) {
        PyObject *r = PyObject_CallObject(g_timeline_full, NULL);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    } else {
        PyObject *item = Py_BuildValue("(OLLkL)", entry, t0, t1, PyThread_get_thread_ident(), link);
        rc = item == NULL ? -1 : PyList_Append(events, item);
        Py_XDECREF(item);
    }
    Py_DECREF(events);
    return rc;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS, "Hand over the objects the fast path reads (see stepbase)."},
    {"bind_count", bind_count, METH_VARARGS, "Hand over what CountHook reads (see _speedups_count.c)."},
    {"bind_anchor", bind_anchor, METH_VARARGS, "Hand over what an anchor's exit reads (see _speedups_anchor.c)."},
    {"set_seq_native", set_seq_native, METH_O,
     "Read autograd's sequence counter by calling this C function address (None: the Python one)."},
    {"seq_nr", read_seq, METH_NOARGS, "Autograd's sequence counter of this thread, as the fast path reads it."},
    {"seq_is_native", seq_is_native, METH_NOARGS, "Whether the fast path reads the counter without a Python call."},
    {"set_clock", set_clock, METH_O, "The CPU clock clocks.cpu.set_cpu_clock() set."},
    {"set_nvtx_live", set_nvtx_live, METH_VARARGS, "Whether NVTX ranges are pushed ([push, pop]: the fast path pushes them)."},
    {"set_timeline", set_timeline, METH_VARARGS, "Record each fast exit on the timeline (see storage.timeline)."},
    {"time_methods", time_methods, METH_VARARGS, "Time owner's methods until restore() (see layers.generic.install)."},
    {"time_children", time_children, METH_VARARGS, "Time children's forward until restore() (see layers.generic.install)."},
    {"restore", restore, METH_O, "Undo time_methods/time_children (see layers.generic.uninstall)."},
    {"sums", sums, METH_VARARGS, "The reductions named in kinds of buf[:n], or None (see entry.fold_buffer)."},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "instrumented_convs.core.native._speedups",
    "The common case of a step in C (instrumented_convs.core.steps.step has the same path in Python).",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_backward, "backward"); INTERN(s_root, "root");
    INTERN(s_prof_on, "_is_profiler_enabled"); INTERN(s_fold, "fold");
    INTERN(s_enter, "_enter");
    INTERN(s_exit, "_exit"); INTERN(s_tls_key, "instrumented_convs.core.native._speedups.stack");
    INTERN(s_forward, "forward"); INTERN(s_ranges, "ranges");
#undef INTERN
    if (PyType_Ready(&FrameType) < 0 || PyType_Ready(&StepBaseType) < 0 || PyType_Ready(&ThreadStateType) < 0
        || PyType_Ready(&TimedType) < 0 || PyType_Ready(&CountHookType) < 0
        || PyType_Ready(&BackwardHookType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Frame", (PyObject *)&FrameType) < 0
        || PyModule_AddObjectRef(m, "StepBase", (PyObject *)&StepBaseType) < 0
        || PyModule_AddObjectRef(m, "ThreadState", (PyObject *)&ThreadStateType) < 0
        || PyModule_AddObjectRef(m, "Timed", (PyObject *)&TimedType) < 0
        || PyModule_AddObjectRef(m, "CountHook", (PyObject *)&CountHookType) < 0
        || PyModule_AddObjectRef(m, "BackwardHook", (PyObject *)&BackwardHookType) < 0
        || PyModule_AddFunctions(m, cuda_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

