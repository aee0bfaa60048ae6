/* The common case of a step, in C: see instrumented_convs/_step.py (the same path in Python).
 *
 * Frame: the frame of an open step (_stack.Frame), its attributes as C fields.
 * StepBase: the base of _step.Step; its __enter__/__exit__ handle, without a Python frame,
 * a step nested in a CPU forward step, with no NVTX range, no profiler label, no exception,
 * logging its autograd node range when its anchor asks; every other case calls the Python
 * methods Step._enter / Step._exit, which are the general implementation.
 * bind(...) hands over the Python objects this code reads (switches, clock, registry).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030A0000  /* Python 3.9 */
static inline PyObject *Py_NewRef(PyObject *o) { Py_INCREF(o); return o; }
static int PyModule_AddObjectRef(PyObject *m, const char *name, PyObject *o) {
    Py_INCREF(o);
    if (PyModule_AddObject(m, name, o) < 0) { Py_DECREF(o); return -1; }
    return 0;
}
#endif

enum { CPU = 0, CUDA = 1, UNTIMED = 2, BOTTOM = 3 };

typedef struct {
    PyObject_HEAD
    PyObject *entry, *start, *rf, *owner, *dev, *spare, *log, *outputs, *task;
    int mode, flags;
    char cuda, anchor;
    long long seq0;
} Frame;

typedef struct {
    PyObject_HEAD
    PyObject *name, *scope, *cuda, *dev, *kind, *key;
    char region;
} StepBase;

static PyTypeObject FrameType, StepBaseType;

/* What bind() hands over. */
static PyObject *g_config, *g_prof, *g_registry, *g_seq, *g_clock_mod, *g_grad_enabled;
static PyObject *g_perf_counter_ns, *g_entry_type, *g_log_type, *g_log_exit;
static Py_ssize_t g_fold_at = 64;
static int g_nvtx_live = 1;  /* set_nvtx_live(): whether NVTX ranges are pushed (then Python does it) */
/* Offsets of the slots of _entry.Entry and _anchor.Log read here (see slot_offset). */
static Py_ssize_t o_retired, o_children, o_buf, o_seq0, o_depth0, o_items, o_outputs;
#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))
static PyObject *s_root, *s_backward, *s_prof_on, *s_fold, *s_cpu_now, *s_enter, *s_exit;

static int truthy_attr(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* A module's global, truthy or not (the module's dict, no attribute machinery): -1 on error. */
static int module_flag(PyObject *mod, PyObject *name) {
    PyObject *d = PyModule_Check(mod) ? PyModule_GetDict(mod) : NULL;
    if (d == NULL) return truthy_attr(mod, name);
    PyObject *v = PyDict_GetItemWithError(d, name);  /* borrowed */
    if (v == NULL) {
        if (PyErr_Occurred()) return -1;
        return truthy_attr(mod, name);
    }
    return PyObject_IsTrue(v);
}

/* The CPU clock (_clock.cpu_now, replaceable by tests), in ns; -1 and an exception on error.
 * When it is time.perf_counter_ns, read the same clock directly: on Linux, CLOCK_MONOTONIC. */
static long long now_ns(void) {
    PyObject *fn = PyDict_GetItemWithError(PyModule_GetDict(g_clock_mod), s_cpu_now);  /* borrowed */
    if (fn == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "_clock.cpu_now");
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
static Py_ssize_t slot_offset(PyObject *cls, const char *name) {
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

static long long seq_nr(void) {
    PyObject *v = PyObject_CallNoArgs(g_seq);
    if (v == NULL) return -1;
    long long s = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return s;
}

/* -- the per-thread stack ------------------------------------------------------------------ */

static PyObject *s_tls_key;

/* This thread's stack of frames (borrowed), made with its bottom sentinel on first use; it
 * lives in the thread state's dict, as threading.local's data does, and dies with it. */
static PyObject *thread_stack(void) {
    PyObject *d = PyThreadState_GetDict();  /* borrowed */
    if (d == NULL) { PyErr_SetString(PyExc_RuntimeError, "no thread state dict"); return NULL; }
    PyObject *stack = PyDict_GetItemWithError(d, s_tls_key);
    if (stack != NULL || PyErr_Occurred()) return stack;
    PyObject *bottom = PyObject_CallNoArgs((PyObject *)&FrameType);
    if (bottom == NULL) return NULL;
    stack = PyList_New(1);
    if (stack == NULL) { Py_DECREF(bottom); return NULL; }
    PyList_SET_ITEM(stack, 0, bottom);
    int rc = PyDict_SetItem(d, s_tls_key, stack);
    Py_DECREF(stack);
    return rc < 0 ? NULL : stack;
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
    .tp_name = "instrumented_convs._speedups.ThreadState",
    .tp_doc = "Per-thread state: ``stack``, this thread's frames (see instrumented_convs._stack).",
    .tp_basicsize = sizeof(ThreadState),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_getset = ThreadState_getset,
};

/* -- folding an entry's buffer ------------------------------------------------------------ */

/* sums(buf, n): (total, sum of squares, min, max) of the first n ints of the list buf, or
 * None when one is not an int of 64 bits (then Python folds them). */
static PyObject *sums(PyObject *mod, PyObject *args) {
    PyObject *buf;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &buf, &n)) return NULL;
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
    PyObject *sq_hi = PyLong_FromUnsignedLongLong((unsigned long long)(sq >> 64));
    PyObject *sq_lo = PyLong_FromUnsignedLongLong((unsigned long long)sq);
    PyObject *shift = PyLong_FromLong(64), *sqo = NULL, *tmp = NULL;
    if (sq_hi && sq_lo && shift && (tmp = PyNumber_Lshift(sq_hi, shift)) != NULL) sqo = PyNumber_Or(tmp, sq_lo);
    Py_XDECREF(sq_hi); Py_XDECREF(sq_lo); Py_XDECREF(shift); Py_XDECREF(tmp);
    if (sqo == NULL) return NULL;
    PyObject *res = NULL;
    if (total >= LLONG_MIN && total <= LLONG_MAX)
        res = Py_BuildValue("(LNLL)", (long long)total, sqo, lo, hi);
    else {
        Py_DECREF(sqo);
        Py_RETURN_NONE;
    }
    return res;
#else
    Py_RETURN_NONE;
#endif
}

/* -- Frame -------------------------------------------------------------------------------- */

static int Frame_init(Frame *self, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Frame() takes no arguments");
        return -1;
    }
    self->mode = BOTTOM;
    self->seq0 = -1;
    return 0;
}

static int Frame_traverse(Frame *self, visitproc visit, void *arg) {
    Py_VISIT(self->entry); Py_VISIT(self->start); Py_VISIT(self->rf); Py_VISIT(self->owner);
    Py_VISIT(self->dev); Py_VISIT(self->spare); Py_VISIT(self->log); Py_VISIT(self->outputs);
    Py_VISIT(self->task);
    return 0;
}

static int Frame_clear(Frame *self) {
    Py_CLEAR(self->entry); Py_CLEAR(self->start); Py_CLEAR(self->rf); Py_CLEAR(self->owner);
    Py_CLEAR(self->dev); Py_CLEAR(self->spare); Py_CLEAR(self->log); Py_CLEAR(self->outputs);
    Py_CLEAR(self->task);
    return 0;
}

static void Frame_dealloc(Frame *self) {
    PyObject_GC_UnTrack(self);
    Frame_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Frame_repr(Frame *self) {
    PyObject *path = self->entry ? PyObject_GetAttrString(self->entry, "path") : NULL;
    if (path == NULL) { PyErr_Clear(); path = Py_NewRef(Py_None); }
    PyObject *r = PyUnicode_FromFormat("Frame(%R, mode=%d)", path, self->mode);
    Py_DECREF(path);
    return r;
}

#define OBJ(n) {#n, T_OBJECT, offsetof(Frame, n), 0, NULL}
static PyMemberDef Frame_members[] = {
    OBJ(entry), OBJ(start), OBJ(rf), OBJ(owner), OBJ(dev), OBJ(spare), OBJ(log), OBJ(outputs), OBJ(task),
    {"mode", T_INT, offsetof(Frame, mode), 0, NULL},
    {"flags", T_INT, offsetof(Frame, flags), 0, NULL},
    {"cuda", T_BOOL, offsetof(Frame, cuda), 0, NULL},
    {"anchor", T_BOOL, offsetof(Frame, anchor), 0, NULL},
    {"seq0", T_LONGLONG, offsetof(Frame, seq0), 0, NULL},
    {NULL},
};
#undef OBJ

static PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrumented_convs._speedups.Frame",
    .tp_doc = "One open step on a thread's stack (see instrumented_convs._stack).",
    .tp_basicsize = sizeof(Frame),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Frame_init,
    .tp_dealloc = (destructor)Frame_dealloc,
    .tp_traverse = (traverseproc)Frame_traverse,
    .tp_clear = (inquiry)Frame_clear,
    .tp_repr = (reprfunc)Frame_repr,
    .tp_members = Frame_members,
};

/* -- StepBase ----------------------------------------------------------------------------- */

static PyObject *delegate_enter(PyObject *self, PyObject *stack, PyObject *top) {
    return PyObject_CallMethodObjArgs(self, s_enter, stack, top, NULL);
}

static PyObject *StepBase_enter(StepBase *self, PyObject *unused) {
    if (g_registry == NULL) { PyErr_SetString(PyExc_RuntimeError, "_speedups.bind() was not called"); return NULL; }
    PyObject *stack = thread_stack(), *result = NULL, *root = NULL, *new_log = NULL;
    if (stack == NULL) return NULL;
    Py_INCREF(stack);
    if (!PyList_CheckExact(stack) || PyList_GET_SIZE(stack) == 0) {
        PyErr_SetString(PyExc_RuntimeError, "instrumented_convs: the thread's step stack is broken");
        goto done;
    }
    Frame *top = (Frame *)PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
    PyObject *parent = top->entry;
    /* The CPU clock: a step on the CPU (device given), or inheriting it from a CPU step. */
    int cpu = self->cuda == Py_False || ((self->cuda == NULL || self->cuda == Py_None) && parent != NULL
                                         && parent != Py_None && !top->cuda);
    int slow = Py_TYPE(top) != &FrameType || !cpu || (top->task != NULL && top->task != Py_None);
    if (!slow && (parent == NULL || parent == Py_None)) {  /* top level: under the registry's root */
        root = PyObject_GetAttr(g_registry, s_root);
        if (root == NULL) goto done;
        parent = root;
    }
    if (!slow)  /* an Entry (else Python reads it) that is not retired */
        slow = (PyObject *)Py_TYPE(parent) != g_entry_type || SLOT(parent, o_retired) != Py_False;
    if (!slow)
        slow = g_nvtx_live;
    if (!slow) {
        int r = module_flag(g_prof, s_prof_on);
        if (r < 0) goto done;
        slow = r;
    }
    PyObject *log = top->log ? top->log : Py_None;
    long long anchor_seq = -1;
    if (!slow && !self->region && log == Py_None) {  /* the outermost step with grad: an anchor */
        int r = module_flag(g_config, s_backward);
        if (r < 0) goto done;
        if (r) {
            PyObject *g = PyObject_CallNoArgs(g_grad_enabled);
            if (g == NULL) goto done;
            r = PyObject_IsTrue(g);
            Py_DECREF(g);
            if (r < 0) goto done;
        }
        if (r) {
            anchor_seq = seq_nr();
            if (anchor_seq < 0 && PyErr_Occurred()) goto done;
            new_log = PyObject_CallFunction(g_log_type, "Ln", anchor_seq, PyList_GET_SIZE(stack));
            if (new_log == NULL) goto done;
        }
    }
    PyObject *entry = NULL;
    if (!slow) {
        PyObject *children = SLOT(parent, o_children);  /* borrowed */
        entry = children && PyDict_CheckExact(children) ? PyDict_GetItemWithError(children, self->key) : NULL;
        Py_XINCREF(entry);
        if (entry != NULL && (PyObject *)Py_TYPE(entry) != g_entry_type) Py_CLEAR(entry);
        if (entry == NULL) {
            if (PyErr_Occurred()) goto done;
            slow = 1;  /* a new path: the registry creates its entry */
        }
    }
    if (slow) {
        Py_XDECREF(entry);
        Py_CLEAR(new_log);
        result = delegate_enter((PyObject *)self, stack, (PyObject *)top);
        goto done;
    }
    Frame *frame = (Frame *)top->spare;  /* never on the stack while top is on top: reusable */
    if (frame == NULL || frame == (Frame *)Py_None) {
        frame = (Frame *)PyObject_CallNoArgs((PyObject *)&FrameType);
        if (frame == NULL) { Py_DECREF(entry); goto done; }
        Py_XSETREF(top->spare, (PyObject *)frame);
    }
    Py_XSETREF(frame->entry, entry);
    Py_XSETREF(frame->owner, Py_NewRef((PyObject *)self));
    frame->cuda = 0;
    frame->flags = 0;
    frame->mode = CPU;
    if (self->region) {
        Py_XSETREF(frame->log, Py_NewRef(log));
        frame->seq0 = -1;
    } else if (new_log != NULL) {  /* an anchor: its own log; its exit walks or counts */
        Py_XSETREF(frame->log, new_log);
        new_log = NULL;
        frame->anchor = 1;
        Py_CLEAR(frame->outputs);
        frame->seq0 = anchor_seq;
    } else if (log != Py_None) {  /* inside an anchor: log the node range for its walk */
        long long s = seq_nr();
        if (s < 0 && PyErr_Occurred()) goto done;
        Py_XSETREF(frame->log, Py_NewRef(log));
        frame->anchor = 0;
        Py_CLEAR(frame->outputs);
        frame->seq0 = s;
    } else {
        Py_CLEAR(frame->log);
        frame->seq0 = -1;
    }
    if (PyList_Append(stack, (PyObject *)frame) < 0) goto done;
    long long t0 = now_ns();  /* the clock last */
    if (t0 == -1 && PyErr_Occurred()) { PySequence_DelItem(stack, PyList_GET_SIZE(stack) - 1); goto done; }
    Py_XSETREF(frame->start, PyLong_FromLongLong(t0));
    result = Py_NewRef((PyObject *)self);
done:
    Py_XDECREF(root);
    Py_XDECREF(new_log);
    Py_DECREF(stack);
    return result;
}

/* Log a nested step's node range in its anchor's log (see _anchor.Log). */
static int log_inner(Frame *frame, Py_ssize_t depth, PyObject *entry) {
    long long seq0 = frame->seq0, seq1 = seq_nr();
    if (seq1 < 0 && PyErr_Occurred()) return -1;
    PyObject *log = frame->log, *outputs = frame->outputs;
    frame->log = NULL;
    frame->outputs = NULL;
    frame->seq0 = -1;
    int rc = 0;
    if (log != NULL && log != Py_None && seq1 != seq0) {
        PyObject *b, *d0, *items, *outs;
        rc = -1;
        if ((PyObject *)Py_TYPE(log) != g_log_type || !(b = SLOT(log, o_seq0)) || !(d0 = SLOT(log, o_depth0))
            || !(items = SLOT(log, o_items)) || !(outs = SLOT(log, o_outputs))) {
            PyErr_SetString(PyExc_TypeError, "instrumented_convs: a step's log is not an _anchor.Log");
        } else {
            long long base = PyLong_AsLongLong(b);
            Py_ssize_t dd = PyLong_AsSsize_t(d0);
            PyObject *item = PyErr_Occurred() ? NULL
                : Py_BuildValue("(LLOni)", seq0 - base, seq1 - base, entry, depth - dd, CPU);
            if (item != NULL) {
                rc = PyList_Append(items, item);
                if (rc == 0 && outputs != NULL && outputs != Py_None) rc = PyList_Append(outs, outputs);
                Py_DECREF(item);
            }
        }
    }
    Py_XDECREF(log);
    Py_XDECREF(outputs);
    return rc;
}

static PyObject *StepBase_exit(StepBase *self, PyObject *const *args, Py_ssize_t nargs) {
    long long t1 = now_ns();  /* the clock first */
    if (t1 == -1 && PyErr_Occurred()) return NULL;
    PyObject *exc_type = nargs > 0 ? args[0] : Py_None;
    PyObject *stack = thread_stack(), *result = NULL, *t1o = NULL;
    if (stack == NULL) return NULL;
    Py_INCREF(stack);
    Py_ssize_t n = PyList_CheckExact(stack) ? PyList_GET_SIZE(stack) : 0;
    Frame *frame = n ? (Frame *)PyList_GET_ITEM(stack, n - 1) : NULL;
    int slow = frame == NULL || Py_TYPE(frame) != &FrameType || frame->owner != (PyObject *)self
        || frame->flags || frame->mode != CPU || exc_type != Py_None || frame->start == NULL;
    if (!slow)
        slow = frame->entry == NULL || (PyObject *)Py_TYPE(frame->entry) != g_entry_type
            || SLOT(frame->entry, o_retired) != Py_False || SLOT(frame->entry, o_buf) == NULL
            || !PyList_CheckExact(SLOT(frame->entry, o_buf));
    if (slow) {
        t1o = PyLong_FromLongLong(t1);
        if (t1o == NULL) goto done;
        result = PyObject_CallMethodObjArgs((PyObject *)self, s_exit, stack,
                                            frame ? (PyObject *)frame : Py_None, t1o, exc_type, NULL);
        goto done;
    }
    Py_INCREF(frame);
    if (PySequence_DelItem(stack, n - 1) < 0) { Py_DECREF(frame); goto done; }
    PyObject *entry = Py_NewRef(frame->entry);
    long long t0 = PyLong_AsLongLong(frame->start);
    PyObject *buf = Py_NewRef(SLOT(entry, o_buf)), *ns = NULL;
    int ok = !(t0 == -1 && PyErr_Occurred()) && (ns = PyLong_FromLongLong(t1 - t0)) != NULL
        && PyList_Append(buf, ns) == 0;
    if (ok && PyList_GET_SIZE(buf) >= g_fold_at) {
        PyObject *r = PyObject_CallMethodObjArgs(g_registry, s_fold, entry, NULL);
        ok = r != NULL;
        Py_XDECREF(r);
    }
    Py_XDECREF(ns);
    Py_DECREF(buf);
    if (ok && frame->seq0 >= 0) {
        if (frame->anchor) {  /* Python walks the anchor's graph or counts it (_anchor.log_exit) */
            PyObject *r = PyObject_CallFunctionObjArgs(g_log_exit, (PyObject *)frame, stack, Py_True, NULL);
            ok = r != NULL;
            Py_XDECREF(r);
        } else {
            ok = log_inner(frame, PyList_GET_SIZE(stack), entry) == 0;
        }
    }
    Py_DECREF(entry);
    Py_DECREF(frame);
    if (ok) result = Py_NewRef(Py_None);
done:
    Py_XDECREF(t1o);
    Py_DECREF(stack);
    return result;
}

static PyMethodDef StepBase_methods[] = {
    {"__enter__", (PyCFunction)StepBase_enter, METH_NOARGS, "Open the step (see Step)."},
    {"__exit__", (PyCFunction)(void (*)(void))StepBase_exit, METH_FASTCALL, "Close the step (see Step)."},
    {NULL},
};

#define SOBJ(n) {#n, T_OBJECT, offsetof(StepBase, n), 0, NULL}
static PyMemberDef StepBase_members[] = {
    SOBJ(name), SOBJ(scope), SOBJ(cuda), SOBJ(dev), SOBJ(kind), SOBJ(key),
    {"region", T_BOOL, offsetof(StepBase, region), 0, NULL},
    {NULL},
};
#undef SOBJ

static void StepBase_dealloc(StepBase *self) {
    Py_CLEAR(self->name); Py_CLEAR(self->scope); Py_CLEAR(self->cuda); Py_CLEAR(self->dev);
    Py_CLEAR(self->kind); Py_CLEAR(self->key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject StepBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrumented_convs._speedups.StepBase",
    .tp_doc = "The common case of Step.__enter__/__exit__ in C (see instrumented_convs._step).",
    .tp_basicsize = sizeof(StepBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)StepBase_dealloc,
    .tp_methods = StepBase_methods,
    .tp_members = StepBase_members,
};

/* -- Timed: a callable run inside a step (see _generic.Timed) ------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *fn, *step;
    vectorcallfunc vectorcall;
} Timed;

static PyObject *step_enter(PyObject *st) {
    if (PyObject_TypeCheck(st, &StepBaseType)) return StepBase_enter((StepBase *)st, NULL);
    return PyObject_CallMethod(st, "__enter__", NULL);
}

static PyObject *step_exit(PyObject *st, PyObject *const *args) {
    if (PyObject_TypeCheck(st, &StepBaseType)) return StepBase_exit((StepBase *)st, args, 3);
    return PyObject_CallMethod(st, "__exit__", "OOO", args[0], args[1], args[2]);
}

/* with self.step: return self.fn(*args, **kwargs) */
static PyObject *Timed_vectorcall(Timed *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *st = self->step, *r = step_enter(st);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    PyObject *res = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    if (res == NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        if (tb != NULL && ev != NULL) PyException_SetTraceback(ev, tb);
        PyObject *exc[3] = {et ? et : Py_None, ev ? ev : Py_None, tb ? tb : Py_None};
        PyObject *x = step_exit(st, exc);
        if (x == NULL) {  /* the exit raised: that exception wins, as in a with block */
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
            return NULL;
        }
        Py_DECREF(x);
        PyErr_Restore(et, ev, tb);
        return NULL;
    }
    PyObject *none[3] = {Py_None, Py_None, Py_None};
    PyObject *x = step_exit(st, none);
    if (x == NULL) { Py_DECREF(res); return NULL; }
    Py_DECREF(x);
    return res;
}

static PyObject *Timed_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *fn, *st;
    static char *names[] = {"fn", "step", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", names, &fn, &st)) return NULL;
    Timed *self = (Timed *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->fn = Py_NewRef(fn);
    self->step = Py_NewRef(st);
    self->vectorcall = (vectorcallfunc)Timed_vectorcall;
    return (PyObject *)self;
}

static int Timed_traverse(Timed *self, visitproc visit, void *arg) {
    Py_VISIT(self->fn); Py_VISIT(self->step);
    return 0;
}

static int Timed_clear(Timed *self) {
    Py_CLEAR(self->fn); Py_CLEAR(self->step);
    return 0;
}

static void Timed_dealloc(Timed *self) {
    PyObject_GC_UnTrack(self);
    Timed_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Timed_members[] = {
    {"fn", T_OBJECT, offsetof(Timed, fn), READONLY, NULL},
    {"step", T_OBJECT, offsetof(Timed, step), READONLY, NULL},
    {NULL},
};

static PyTypeObject TimedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrumented_convs._speedups.Timed",
    .tp_doc = "Timed(fn, step): calls fn inside step (see instrumented_convs._generic.Timed).",
    .tp_basicsize = sizeof(Timed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Timed_new,
    .tp_dealloc = (destructor)Timed_dealloc,
    .tp_traverse = (traverseproc)Timed_traverse,
    .tp_clear = (inquiry)Timed_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Timed, vectorcall),
    .tp_members = Timed_members,
};

/* -- installing Timed callables on instances (see _generic.install) ------------------------ */

/* Time owner.name as step until restore(): a Timed in the instance dict, and an undo record. */
static int time_one(PyObject *owner, PyObject *name, PyObject *st, PyObject *undo) {
    PyObject **dp = _PyObject_GetDictPtr(owner);
    if (dp == NULL || *dp == NULL) return 0;  /* no instance dict: nothing to do */
    PyObject *d = *dp, *cur = PyDict_GetItemWithError(d, name), *fn;
    if (cur == NULL) {
        if (PyErr_Occurred()) return -1;
        PyObject *attr = _PyType_Lookup(Py_TYPE(owner), name);  /* borrowed */
        if (attr == NULL) return 0;
        descrgetfunc get = Py_TYPE(attr)->tp_descr_get;
        fn = get ? get(attr, owner, (PyObject *)Py_TYPE(owner)) : Py_NewRef(attr);
        if (fn == NULL) return -1;
    } else if (Py_TYPE(cur) == &TimedType) {
        return 0;  /* already timed (the same layer called inside its own forward) */
    } else {
        fn = Py_NewRef(cur);  /* set on the instance by someone else: time that */
    }
    Timed *t = (Timed *)TimedType.tp_alloc(&TimedType, 0);
    if (t == NULL) { Py_DECREF(fn); return -1; }
    t->fn = fn;
    t->step = Py_NewRef(st);
    t->vectorcall = (vectorcallfunc)Timed_vectorcall;
    PyObject *rec = PyTuple_Pack(3, d, name, cur ? cur : Py_None);
    int rc = rec ? PyList_Append(undo, rec) : -1;
    Py_XDECREF(rec);
    if (rc == 0) rc = PyDict_SetItem(d, name, (PyObject *)t);
    Py_DECREF(t);
    return rc;
}

/* time_methods(owner, ((name, step), ...), undo), time_children(((child, step), ...), undo). */
static PyObject *time_methods(PyObject *mod, PyObject *args) {
    PyObject *owner, *pairs, *undo;
    if (!PyArg_ParseTuple(args, "OO!O!", &owner, &PyTuple_Type, &pairs, &PyList_Type, &undo)) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pairs); i++) {
        PyObject *p = PyTuple_GET_ITEM(pairs, i);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2) { PyErr_SetString(PyExc_TypeError, "(name, step) pairs"); return NULL; }
        if (time_one(owner, PyTuple_GET_ITEM(p, 0), PyTuple_GET_ITEM(p, 1), undo) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *s_forward;

static PyObject *time_children(PyObject *mod, PyObject *args) {
    PyObject *kids, *undo;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &kids, &PyList_Type, &undo)) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kids); i++) {
        PyObject *p = PyList_GET_ITEM(kids, i);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2) { PyErr_SetString(PyExc_TypeError, "(child, step) pairs"); return NULL; }
        if (time_one(PyTuple_GET_ITEM(p, 0), s_forward, PyTuple_GET_ITEM(p, 1), undo) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* restore(undo): put back what time_methods/time_children changed, latest first. */
static PyObject *restore(PyObject *mod, PyObject *undo) {
    if (!PyList_Check(undo)) { PyErr_SetString(PyExc_TypeError, "a list"); return NULL; }
    for (Py_ssize_t i = PyList_GET_SIZE(undo) - 1; i >= 0; i--) {
        PyObject *rec = PyList_GET_ITEM(undo, i), *d = PyTuple_GET_ITEM(rec, 0), *name = PyTuple_GET_ITEM(rec, 1);
        PyObject *cur = PyTuple_GET_ITEM(rec, 2);
        if (cur == Py_None) {
            if (PyDict_DelItem(d, name) < 0) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError)) return NULL;
                PyErr_Clear();
            }
        } else if (PyDict_SetItem(d, name, cur) < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* -- module ------------------------------------------------------------------------------- */

static PyObject *bind(PyObject *mod, PyObject *args) {
    PyObject *config, *prof, *registry, *seq, *clock_mod, *grad_enabled, *entry_t, *log_t, *pc, *log_exit;
    Py_ssize_t fold_at;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOn", &config, &prof, &registry, &seq, &clock_mod, &grad_enabled,
                          &entry_t, &log_t, &pc, &log_exit, &fold_at))
        return NULL;
    Py_XSETREF(g_log_exit, Py_NewRef(log_exit));
    if (!PyModule_Check(clock_mod)) { PyErr_SetString(PyExc_TypeError, "clock_mod: a module"); return NULL; }
    o_retired = slot_offset(entry_t, "retired"); o_children = slot_offset(entry_t, "children");
    o_buf = slot_offset(entry_t, "buf"); o_seq0 = slot_offset(log_t, "seq0");
    o_depth0 = slot_offset(log_t, "depth0"); o_items = slot_offset(log_t, "items");
    o_outputs = slot_offset(log_t, "outputs");
    if (o_retired < 0 || o_children < 0 || o_buf < 0 || o_seq0 < 0 || o_depth0 < 0 || o_items < 0 || o_outputs < 0) {
        PyErr_SetString(PyExc_TypeError, "Entry and Log must be classes with __slots__ (see _speedups.c)");
        return NULL;
    }
    Py_XSETREF(g_entry_type, Py_NewRef(entry_t)); Py_XSETREF(g_log_type, Py_NewRef(log_t));
    Py_XSETREF(g_perf_counter_ns, Py_NewRef(pc));
    Py_XSETREF(g_config, Py_NewRef(config)); Py_XSETREF(g_prof, Py_NewRef(prof));
    Py_XSETREF(g_registry, Py_NewRef(registry)); Py_XSETREF(g_seq, Py_NewRef(seq));
    Py_XSETREF(g_clock_mod, Py_NewRef(clock_mod)); Py_XSETREF(g_grad_enabled, Py_NewRef(grad_enabled));
    g_fold_at = fold_at;
    Py_RETURN_NONE;
}

static PyObject *set_nvtx_live(PyObject *mod, PyObject *arg) {
    int r = PyObject_IsTrue(arg);
    if (r < 0) return NULL;
    g_nvtx_live = r;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS, "Hand over the objects the fast path reads (see _stepbase)."},
    {"set_nvtx_live", set_nvtx_live, METH_O, "Whether NVTX ranges are pushed (the fast path leaves them to Python)."},
    {"time_methods", time_methods, METH_VARARGS, "Time owner's methods until restore() (see _generic.install)."},
    {"time_children", time_children, METH_VARARGS, "Time children's forward until restore() (see _generic.install)."},
    {"restore", restore, METH_O, "Undo time_methods/time_children (see _generic.uninstall)."},
    {"sums", sums, METH_VARARGS, "(total, sum of squares, min, max) of buf[:n], or None (see _entry)."},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "instrumented_convs._speedups",
    "The common case of a step in C (instrumented_convs._step has the same path in Python).",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_backward, "backward"); INTERN(s_root, "root");
    INTERN(s_prof_on, "_is_profiler_enabled"); INTERN(s_fold, "fold"); INTERN(s_cpu_now, "cpu_now");
    INTERN(s_enter, "_enter");
    INTERN(s_exit, "_exit"); INTERN(s_tls_key, "instrumented_convs._speedups.stack");
    INTERN(s_forward, "forward");
#undef INTERN
    if (PyType_Ready(&FrameType) < 0 || PyType_Ready(&StepBaseType) < 0 || PyType_Ready(&ThreadStateType) < 0
        || PyType_Ready(&TimedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Frame", (PyObject *)&FrameType) < 0
        || PyModule_AddObjectRef(m, "StepBase", (PyObject *)&StepBaseType) < 0
        || PyModule_AddObjectRef(m, "ThreadState", (PyObject *)&ThreadStateType) < 0
        || PyModule_AddObjectRef(m, "Timed", (PyObject *)&TimedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
