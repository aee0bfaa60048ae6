/* BackwardHook: the pre-hook and post-hook of a timed step's backward nodes, with the tool's
 * own time read in C (see _speedups.h; the Python twin is hooks.pre_hook/post_hook). */
#include "_speedups.h"

typedef struct {
    PyObject_HEAD
    PyObject *fn, *records;  /* hooks._start or hooks._end (they never raise), its records */
} BackwardHook;

/* fn(records, t_in), then the time from t_in to now added to the thread's own time (the
 * bottom frame's own): the steps around leave it out. Autograd's own call of the hook, and
 * what runs before the first reading here, is all that is left of it. */
static PyObject *BackwardHook_call(BackwardHook *self, PyObject *args, PyObject *kw) {
    long long t_in = now_ns();
    if (t_in == -1 && PyErr_Occurred()) return NULL;
    PyObject *t = PyLong_FromLongLong(t_in);
    if (t == NULL) return NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(self->fn, self->records, t, NULL);
    Py_DECREF(t);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    long long t_out = now_ns();
    if (t_out == -1 && PyErr_Occurred()) return NULL;
    PyObject *stack = thread_stack();  /* borrowed */
    if (stack == NULL) return NULL;
    if (PyList_CheckExact(stack) && PyList_GET_SIZE(stack) > 0) {
        Frame *bottom = (Frame *)PyList_GET_ITEM(stack, 0);
        if (Py_TYPE(bottom) == &FrameType) bottom->own += t_out - t_in;
    }
    Py_RETURN_NONE;  /* a hook's None: the gradients as they are */
}

static PyObject *BackwardHook_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *fn, *records;
    static char *names[] = {"fn", "records", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", names, &fn, &records)) return NULL;
    BackwardHook *self = (BackwardHook *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->fn = Py_NewRef(fn);
    self->records = Py_NewRef(records);
    return (PyObject *)self;
}

static int BackwardHook_traverse(BackwardHook *self, visitproc visit, void *arg) {
    Py_VISIT(self->fn); Py_VISIT(self->records);
    return 0;
}

static int BackwardHook_clear(BackwardHook *self) {
    Py_CLEAR(self->fn); Py_CLEAR(self->records);
    return 0;
}

static void BackwardHook_dealloc(BackwardHook *self) {
    PyObject_GC_UnTrack(self);
    BackwardHook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef BackwardHook_members[] = {
    {"fn", T_OBJECT, offsetof(BackwardHook, fn), READONLY, NULL},
    {"records", T_OBJECT, offsetof(BackwardHook, records), READONLY, NULL},
    {NULL},
};

PyTypeObject BackwardHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrumented_convs.core.native._speedups.BackwardHook",
    .tp_doc = "BackwardHook(fn, records): a backward step's node hook, its own time read in C (see backward.hooks).",
    .tp_basicsize = sizeof(BackwardHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = BackwardHook_new,
    .tp_call = (ternaryfunc)BackwardHook_call,
    .tp_dealloc = (destructor)BackwardHook_dealloc,
    .tp_traverse = (traverseproc)BackwardHook_traverse,
    .tp_clear = (inquiry)BackwardHook_clear,
    .tp_members = BackwardHook_members,
};
