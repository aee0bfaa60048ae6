/* Frame and StepBase: the fast __enter__/__exit__ of a step (see _speedups.h, stepbase.py). */
#include "_speedups.h"

/* -- Frame -------------------------------------------------------------------------------- */

static int Frame_init(Frame *self, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Frame() takes no arguments");
        return -1;
    }
    self->mode = BOTTOM;
    self->seq0 = -1;
    self->has_t0 = 0;
    return 0;
}

static int Frame_traverse(Frame *self, visitproc visit, void *arg) {
    Py_VISIT(self->entry); Py_VISIT(self->event); Py_VISIT(self->rf); Py_VISIT(self->owner);
    Py_VISIT(self->dev); Py_VISIT(self->spare); Py_VISIT(self->log); Py_VISIT(self->outputs);
    Py_VISIT(self->task); Py_VISIT(self->gpu); Py_VISIT(self->start_obj);
    return 0;
}

static int Frame_clear(Frame *self) {
    Py_CLEAR(self->entry); Py_CLEAR(self->event); Py_CLEAR(self->rf); Py_CLEAR(self->owner);
    Py_CLEAR(self->dev); Py_CLEAR(self->spare); Py_CLEAR(self->log); Py_CLEAR(self->outputs);
    Py_CLEAR(self->task); Py_CLEAR(self->gpu); Py_CLEAR(self->start_obj);
    self->cu_start = NULL;
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

/* start: the CPU clock at a CPU or CUDA frame's entry, integer ns: t0, a C integer when the C
 * enter set it (has_t0), else the int a Python enter set (kept to be read back as is). A
 * Python write leaves the frame's exit to Python (has_t0 cleared). */
static PyObject *Frame_get_start(Frame *self, void *closure) {
    if (!self->has_t0 && self->start_obj != NULL) return Py_NewRef(self->start_obj);
    return PyLong_FromLongLong(self->t0);
}

static int Frame_set_start(Frame *self, PyObject *value, void *closure) {
    if (value == NULL || !PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "Frame.start: the CPU clock, an int of ns");
        return -1;
    }
    int overflow = 0;
    long long t = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "Frame.start: more ns than 64 bits hold");
        return -1;
    }
    if (t == -1 && PyErr_Occurred()) return -1;
    self->t0 = t;
    Py_XSETREF(self->start_obj, Py_NewRef(value));
    self->has_t0 = 0;
    return 0;
}

/* event: a CUDA frame's start event: the C clock's (cu_start) read as its handle, an int; or
 * the object Python set (the twin's torch.cuda.Event, a test's fake). An int set is a handle. */
static PyObject *Frame_get_event(Frame *self, void *closure) {
    if (self->cu_start != NULL) return PyLong_FromVoidPtr(self->cu_start);
    return Py_NewRef(self->event ? self->event : Py_None);
}

static int Frame_set_event(Frame *self, PyObject *value, void *closure) {
    if (value != NULL && PyLong_CheckExact(value)) {
        void *h = PyLong_AsVoidPtr(value);
        if (h == NULL && PyErr_Occurred()) return -1;
        self->cu_start = h;
        Py_CLEAR(self->event);
        return 0;
    }
    self->cu_start = NULL;
    Py_XSETREF(self->event, value == NULL || value == Py_None ? NULL : Py_NewRef(value));
    return 0;
}

static PyGetSetDef Frame_getset[] = {
    {"start", (getter)Frame_get_start, (setter)Frame_set_start,
     "The CPU clock at a CPU or CUDA frame's entry, integer ns.", NULL},
    {"event", (getter)Frame_get_event, (setter)Frame_set_event,
     "A CUDA frame's start event (an int: the C clock's handle), else None.", NULL},
    {NULL},
};

#define OBJ(n) {#n, T_OBJECT, offsetof(Frame, n), 0, NULL}
static PyMemberDef Frame_members[] = {
    OBJ(entry), OBJ(rf), OBJ(owner), OBJ(dev), OBJ(spare), OBJ(log), OBJ(outputs), OBJ(task),
    OBJ(gpu),
    {"mode", T_INT, offsetof(Frame, mode), 0, NULL},
    {"flags", T_INT, offsetof(Frame, flags), 0, NULL},
    {"cuda", T_BOOL, offsetof(Frame, cuda), 0, NULL},
    {"anchor", T_BOOL, offsetof(Frame, anchor), 0, NULL},
    {"seq0", T_LONGLONG, offsetof(Frame, seq0), 0, NULL},
    {"event_device", T_INT, offsetof(Frame, event_device), 0, NULL},
    {"own", T_LONGLONG, offsetof(Frame, own), 0, NULL},
    {"opened", T_LONGLONG, offsetof(Frame, opened), 0, NULL},
    {NULL},
};
#undef OBJ

PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrumented_convs.core.native._speedups.Frame",
    .tp_doc = "One open step on a thread's stack (see instrumented_convs.core.frames.stack).",
    .tp_basicsize = sizeof(Frame),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Frame_init,
    .tp_dealloc = (destructor)Frame_dealloc,
    .tp_traverse = (traverseproc)Frame_traverse,
    .tp_clear = (inquiry)Frame_clear,
    .tp_repr = (reprfunc)Frame_repr,
    .tp_members = Frame_members,
    .tp_getset = Frame_getset,
};

/* -- StepBase ----------------------------------------------------------------------------- */

static PyObject *delegate_enter(PyObject *self, PyObject *stack, PyObject *top) {
    return PyObject_CallMethodObjArgs(self, s_enter, stack, top, NULL);
}

/* An outermost step with grad recording is an anchor (see backward.anchor): its new log
 * (*new_log) and the sequence number at its entry (*seq); none while backward timing is off
 * or grad is not enabled. 0, or -1 with an exception. */
static inline int anchor_start(Py_ssize_t depth, long long *seq, PyObject **new_log) {
    int r = module_flag(g_config, s_backward);
    if (r < 0) return -1;
    if (r) {
        PyObject *g = PyObject_CallNoArgs(g_grad_enabled);
        if (g == NULL) return -1;
        r = PyObject_IsTrue(g);
        Py_DECREF(g);
        if (r < 0) return -1;
    }
    if (!r) return 0;
    *seq = seq_nr();
    if (*seq < 0 && PyErr_Occurred()) return -1;
    *new_log = new_anchor_log(*seq, depth);
    return *new_log == NULL ? -1 : 0;
}

/* The backward logging of a frame being opened: a region logs nothing itself (its steps log
 * in log), an anchor takes its new log (*new_log, taken over), a step inside an anchor logs
 * its node range from now, any other step logs nothing. 0, or -1 with an exception. */
static inline int fill_log(Frame *frame, char region, PyObject *log, PyObject **new_log,
                           long long anchor_seq) {
    if (region) {
        Py_XSETREF(frame->log, Py_NewRef(log));
        frame->seq0 = -1;
    } else if (*new_log != NULL) {  /* an anchor: its own log; its exit walks or counts */
        Py_XSETREF(frame->log, *new_log);
        *new_log = NULL;
        frame->anchor = 1;
        Py_CLEAR(frame->outputs);
        frame->seq0 = anchor_seq;
    } else if (log != Py_None) {  /* inside an anchor: log the node range for its walk */
        long long s = seq_nr();
        if (s < 0 && PyErr_Occurred()) return -1;
        Py_XSETREF(frame->log, Py_NewRef(log));
        frame->anchor = 0;
        Py_CLEAR(frame->outputs);
        frame->seq0 = s;
    } else {
        Py_CLEAR(frame->log);
        frame->seq0 = -1;
    }
    return 0;
}

PyObject *StepBase_enter(StepBase *self, PyObject *unused) {
    if (g_registry == NULL) { PyErr_SetString(PyExc_RuntimeError, "_speedups.bind() was not called"); return NULL; }
    long long t_in = now_ns();  /* the tool's own time starts (see Frame.own) */
    if (t_in == -1 && PyErr_Occurred()) return NULL;
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
    /* The C CUDA clock: a step on a CUDA device (given), or inheriting it from a CUDA step. */
    int cuda = !cpu && g_cuda_native && g_timeline == NULL
        && (self->cuda == Py_True || ((self->cuda == NULL || self->cuda == Py_None) && parent != NULL
                                      && parent != Py_None && top->cuda));
    int slow = Py_TYPE(top) != &FrameType || !(cpu || cuda) || (top->task != NULL && top->task != Py_None);
    if (!slow && (parent == NULL || parent == Py_None)) {  /* top level: under the registry's root */
        root = PyObject_GetAttr(g_registry, s_root);
        if (root == NULL) goto done;
        parent = root;
    }
    if (!slow)  /* an Entry (else Python reads it) that is not retired */
        slow = (PyObject *)Py_TYPE(parent) != g_entry_type || SLOT(parent, o_retired) != Py_False;
    if (!slow)  /* ranges pushed by Python's path, unless the backend's calls were handed over */
        slow = g_nvtx_live && g_nvtx_push == NULL;
    int ranged = 0;  /* the ranges mode (switches.ranges): the range is all a step records */
    if (!slow && g_nvtx_push != NULL) {
        PyObject *v = PyObject_GetAttr(g_config, s_ranges);
        ranged = v ? PyObject_IsTrue(v) : -1;
        Py_XDECREF(v);
        if (ranged < 0) goto done;
    }
    if (!slow) {
        int r = module_flag(g_prof, s_prof_on);
        if (r < 0) goto done;
        slow = r;
    }
    PyObject *log = top->log ? top->log : Py_None;
    long long anchor_seq = -1;
    if (!slow && !self->region && log == Py_None  /* the outermost step: an anchor? */
        && anchor_start(PyList_GET_SIZE(stack), &anchor_seq, &new_log) < 0)
        goto done;
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
    frame->cuda = (char)cuda;  /* what children inherit, in the ranges mode too */
    frame->flags = 0;
    frame->mode = CPU;
    if (fill_log(frame, self->region, log, &new_log, anchor_seq) < 0) goto done;
    if (frame->start_obj != NULL) Py_CLEAR(frame->start_obj);  /* the int a Python enter left */
    if (PyList_Append(stack, (PyObject *)frame) < 0) goto done;
    if (g_nvtx_push != NULL) {  /* the range, as frames.lifecycle.open_frame pushes it: the
                                   entry's layer (a step inherits its parent's), kind, clock */
        PyObject *scope = SLOT(entry, o_scope);
        PyObject *r = PyObject_CallFunctionObjArgs(g_nvtx_push, self->name, scope ? scope : Py_None,
                                                   self->region ? Py_True : Py_False, cuda ? Py_False : Py_True, NULL);
        if (r == NULL) { PySequence_DelItem(stack, PyList_GET_SIZE(stack) - 1); goto done; }
        Py_DECREF(r);
        frame->flags = ranged ? PUSHED | RANGED : PUSHED;
        if (ranged) cuda = 0;  /* no event: the range is all the frame records */
    }
    if (cuda) {  /* the start event, recorded before the clock: the host time leaves it out */
        PyObject *dev = self->cuda == Py_True ? self->dev : top->dev;
        Py_XSETREF(frame->dev, Py_NewRef(dev ? dev : Py_None));
        Py_CLEAR(frame->event);
        Py_CLEAR(frame->gpu);
        void *ev = NULL;
        int d = cuda_device_of(frame->dev);
        int r = d < 0 ? -1 : cuda_record_now(d, &ev);
        if (r < 0) PyErr_Clear();  /* a pending device error, say: time nothing, fail nothing */
        frame->cu_start = r > 0 ? ev : NULL;
        frame->mode = r > 0 ? CUDA : UNTIMED;
        frame->event_device = r > 0 ? d : 0;
    }
    long long t0 = now_ns();  /* the clock last */
    if (t0 == -1 && PyErr_Occurred()) {  /* undo the frame: its range, its start event */
        PySequence_DelItem(stack, PyList_GET_SIZE(stack) - 1);
        if (frame->flags & PUSHED) {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            Py_XDECREF(PyObject_CallNoArgs(g_nvtx_pop));
            PyErr_Clear();
            PyErr_Restore(et, ev, tb);
        }
        if (frame->mode == CUDA && frame->cu_start != NULL) cuda_put_event(frame->event_device, frame->cu_start);
        frame->cu_start = NULL;
        goto done;
    }
    frame->t0 = t0;
    frame->has_t0 = 1;
    Frame *bottom = (Frame *)PyList_GET_ITEM(stack, 0);  /* the thread's own time: see backward.hooks */
    if (Py_TYPE(bottom) == &FrameType) {
        bottom->own += t0 - t_in;
        bottom->opened++;
        frame->own = bottom->own;
    }
    result = Py_NewRef((PyObject *)self);
done:
    Py_XDECREF(root);
    Py_XDECREF(new_log);
    Py_DECREF(stack);
    return result;
}

PyObject *StepBase_exit(StepBase *self, PyObject *const *args, Py_ssize_t nargs) {
    long long t1 = now_ns();  /* the clock first */
    if (t1 == -1 && PyErr_Occurred()) return NULL;
    PyObject *exc_type = nargs > 0 ? args[0] : Py_None;
    PyObject *stack = thread_stack(), *result = NULL, *t1o = NULL;
    if (stack == NULL) return NULL;
    Py_INCREF(stack);
    Py_ssize_t n = PyList_CheckExact(stack) ? PyList_GET_SIZE(stack) : 0;
    Frame *frame = n ? (Frame *)PyList_GET_ITEM(stack, n - 1) : NULL;
    int slow = frame == NULL || Py_TYPE(frame) != &FrameType || frame->owner != (PyObject *)self
        || (frame->flags & ~(PUSHED | RANGED)) || (frame->flags && g_nvtx_pop == NULL)
        || exc_type != Py_None || !frame->has_t0
        || (frame->mode != CPU && !(frame->mode == CUDA && frame->cu_start != NULL && frame->gpu == NULL));
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
    Frame *bottom = (Frame *)PyList_GET_ITEM(stack, 0);
    if (Py_TYPE(bottom) != &FrameType) bottom = NULL;
    /* the tool's own time inside the step (its children's enters and exits, backward hooks) */
    long long own = bottom != NULL && !self->region ? bottom->own - frame->own : 0;
    Py_SET_SIZE(stack, n - 1);  /* pop: the list's reference to frame is ours now (list.pop's
                                   own shrink of the storage is left to the next resize) */
    PyObject *entry = Py_NewRef(frame->entry);
    int ok;
    if (frame->flags & RANGED) {  /* the ranges mode: nothing recorded but the backward's log */
        ok = 1;
    } else if (frame->mode == CUDA) {  /* the end event, then the pair queued with its host time */
        void *start = frame->cu_start, *end = NULL;
        frame->cu_start = NULL;
        int r = cuda_record_now(frame->event_device, &end);
        if (r > 0) {
            ok = cuda_pend(entry, start, end, frame->event_device, t1, t1 - frame->t0 - own, 0, NULL) == 0;
        } else {  /* capture began inside the step, or a device error: counted as untimed */
            if (r < 0) PyErr_Clear();
            cuda_put_event(frame->event_device, start);
            PyObject *u = PyObject_CallMethod(g_registry, "record_untimed", "O", entry);
            ok = u != NULL;
            Py_XDECREF(u);
        }
    } else {
        PyObject *buf = Py_NewRef(SLOT(entry, o_buf)), *ns = NULL;
        ok = (ns = PyLong_FromLongLong(t1 - frame->t0 - own)) != NULL && PyList_Append(buf, ns) == 0;
        if (ok && PyList_GET_SIZE(buf) >= g_fold_at) {
            PyObject *r = PyObject_CallMethodObjArgs(g_registry, s_fold, entry, NULL);
            ok = r != NULL;
            Py_XDECREF(r);
        }
        Py_XDECREF(ns);
        Py_DECREF(buf);
        if (ok && g_timeline != NULL)
            ok = timeline_add(entry, frame->t0, t1, frame->seq0) == 0;
    }
    if (frame->flags & PUSHED) {  /* the range closes after the clock (and a CUDA end event) */
        PyObject *et = NULL, *ev = NULL, *tb = NULL;
        if (ok && g_nvtx_timed != NULL && !(frame->flags & RANGED)) {
            /* the range holds the tool's time the clock left out (its children's and hooks',
               ours since t1): it closes with the step's time (frames.lifecycle.close_frame) */
            long long t_m = now_ns();
            ok = !(t_m == -1 && PyErr_Occurred());
            if (ok && own + (t_m - t1) >= g_timed_floor) {
                PyObject *ns = PyLong_FromLongLong(t1 - frame->t0 - own), *m = NULL;
                ok = ns != NULL && (m = PyObject_CallOneArg(g_nvtx_timed, ns)) != NULL;
                Py_XDECREF(m);
                Py_XDECREF(ns);
            }
        }
        if (!ok) PyErr_Fetch(&et, &ev, &tb);
        PyObject *r = PyObject_CallNoArgs(g_nvtx_pop);
        if (r == NULL) ok = 0;
        Py_XDECREF(r);
        if (et != NULL) {  /* the first error wins */
            PyErr_Clear();
            PyErr_Restore(et, ev, tb);
        }
    }
    if (ok && frame->seq0 >= 0) {
        if (frame->anchor) {  /* counted here, else Python walks or counts it (anchor.log_exit) */
            if (!anchor_exit(frame, stack, entry)) {
                PyObject *r = PyObject_CallFunctionObjArgs(g_log_exit, (PyObject *)frame, stack, Py_True, NULL);
                ok = r != NULL;
                Py_XDECREF(r);
            }
        } else {
            ok = log_inner(frame, PyList_GET_SIZE(stack), entry) == 0;
        }
    }
    Py_DECREF(entry);
    Py_DECREF(frame);
    if (ok && bottom != NULL) {  /* this exit's own time, to the steps still open */
        long long t_out = now_ns();
        ok = !(t_out == -1 && PyErr_Occurred());
        if (ok) bottom->own += t_out - t1;
    }
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

PyTypeObject StepBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrumented_convs.core.native._speedups.StepBase",
    .tp_doc = "The common case of Step.__enter__/__exit__ in C (see instrumented_convs.core.steps.step).",
    .tp_basicsize = sizeof(StepBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)StepBase_dealloc,
    .tp_methods = StepBase_methods,
    .tp_members = StepBase_members,
};

