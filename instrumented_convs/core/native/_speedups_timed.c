/* Timed, and installing it on instances (see _speedups.h, layers/generic.py). */
#include "_speedups.h"

/* -- Timed: a callable run inside a step (see contract.Timed) ------------------------------- */

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

PyTypeObject TimedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrumented_convs.core.native._speedups.Timed",
    .tp_doc = "Timed(fn, step): calls fn inside step (see instrumented_convs.layers.contract.Timed).",
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

/* -- installing Timed callables on instances (see generic.install) ------------------------- */

/* Time owner.name as step until restore(): a Timed in the instance dict, and an undo record. */
static int time_one(PyObject *owner, PyObject *name, PyObject *st, PyObject *undo) {
    PyObject **dp = _PyObject_GetDictPtr(owner);
    if (dp == NULL || *dp == NULL) return 0;  /* no instance dict: nothing to do */
    PyObject *d = *dp, *cur = PyDict_GetItemWithError(d, name), *fn;
    if (cur == Py_None) return 0;  /* held as None (an activation not given): nothing to time */
    if (cur == NULL) {
        if (PyErr_Occurred()) return -1;
        PyObject *attr = _PyType_Lookup(Py_TYPE(owner), name);  /* borrowed */
        if (attr == NULL) return 0;
        descrgetfunc get = Py_TYPE(attr)->tp_descr_get;
        fn = get ? get(attr, owner, (PyObject *)Py_TYPE(owner)) : Py_NewRef(attr);
        if (fn == NULL) return -1;
    } else if (Py_TYPE(cur) == &TimedType) {
        return 0;  /* already timed (the same layer called inside its own forward) */
    } else if (PyCallable_Check(cur)) {
        fn = Py_NewRef(cur);  /* set on the instance (an activation, a user): time that */
    } else {
        return 0;
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
PyObject *time_methods(PyObject *mod, PyObject *args) {
    PyObject *owner, *pairs, *undo;
    if (!PyArg_ParseTuple(args, "OO!O!", &owner, &PyTuple_Type, &pairs, &PyList_Type, &undo)) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pairs); i++) {
        PyObject *p = PyTuple_GET_ITEM(pairs, i);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2) { PyErr_SetString(PyExc_TypeError, "(name, step) pairs"); return NULL; }
        if (time_one(owner, PyTuple_GET_ITEM(p, 0), PyTuple_GET_ITEM(p, 1), undo) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *time_children(PyObject *mod, PyObject *args) {
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
PyObject *restore(PyObject *mod, PyObject *undo) {
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

