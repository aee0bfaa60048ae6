/* CountHook: the hook that counts a backward not timed, its common case without a Python
 * frame (see _speedups.h; the Python twin is sampling._Count, whose body is sampling.counted). */
#include "_speedups.h"

/* What bind_count() hands over. */
static PyObject *g_skips, *g_counted;  /* registry._skips (a deque), sampling.counted */
static Py_ssize_t o_under = -1;       /* the slot Template._under */
static Py_ssize_t g_fold_skips = 0;   /* registry.SKIPS_FOLD_AT: Python appends the one reaching it */
static PyObject *s_enabled, *s_append;

PyObject *bind_count(PyObject *mod, PyObject *args) {
    PyObject *template_t, *skips, *counted;
    Py_ssize_t fold_at;
    if (!PyArg_ParseTuple(args, "OOOn", &template_t, &skips, &counted, &fold_at)) return NULL;
    o_under = slot_offset(template_t, "_under");
    if (o_under < 0) {
        PyErr_SetString(PyExc_TypeError, "Template must be a class with __slots__ (see CountHook)");
        return NULL;
    }
#define INTERN(var, text) if (var == NULL && (var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_enabled, "enabled"); INTERN(s_append, "append");
#undef INTERN
    Py_XSETREF(g_skips, Py_NewRef(skips));
    Py_XSETREF(g_counted, Py_NewRef(counted));
    g_fold_skips = fold_at;
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    PyObject *template, *fwd_stack;
} CountHook;

/* The common case of sampling.counted: the switches on, a forward step open on this thread
 * (the backward's parent, not a backward frame left open) that is not retired, the template's entries under it cached, the
 * registry's queue of skipped calls short: append them. 1 done, 0 not the common case, -1 error. */
static int count_fast(CountHook *self) {
    if (g_skips == NULL || o_under < 0) return 0;
    int on = module_flag(g_config, s_enabled);
    if (on > 0) on = module_flag(g_config, s_backward);
    if (on <= 0) return on < 0 ? -1 : 1;  /* switched off: nothing to count */
    PyObject *stack = thread_stack();
    if (stack == NULL) return -1;
    if (!PyList_CheckExact(stack) || PyList_GET_SIZE(stack) == 0) return 0;
    Frame *top = (Frame *)PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
    if (Py_TYPE(top) != &FrameType) return 0;
    if (top->task != NULL && top->task != Py_None) return 0;  /* a step's backward run in part */
    PyObject *parent = top->entry;
    if (parent == NULL || (PyObject *)Py_TYPE(parent) != g_entry_type || SLOT(parent, o_retired) != Py_False)
        return 0;  /* no step open here (a CUDA device thread), or opened before a reset */
    PyObject *under = SLOT(self->template, o_under);
    if (under == NULL || !PyDict_CheckExact(under)) return 0;
    PyObject *entries = PyDict_GetItemWithError(under, parent);  /* borrowed */
    if (entries == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t n = PyObject_Length(g_skips);
    if (n < 0) return -1;
    if (n + 1 >= g_fold_skips) return 0;  /* Python appends and folds */
    PyObject *r = PyObject_CallMethodOneArg(g_skips, s_append, entries);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 1;
}

static PyObject *CountHook_call(CountHook *self, PyObject *args, PyObject *kw) {
    int r = count_fast(self);
    if (r == 1) Py_RETURN_NONE;
    if (r < 0) PyErr_Clear();  /* the Python path does it again, and logs what fails there */
    return PyObject_CallFunctionObjArgs(g_counted, self->template, self->fwd_stack, NULL);
}

static PyObject *CountHook_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *template, *fwd_stack;
    static char *names[] = {"template", "fwd_stack", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", names, &template, &fwd_stack)) return NULL;
    CountHook *self = (CountHook *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->template = Py_NewRef(template);
    self->fwd_stack = Py_NewRef(fwd_stack);
    return (PyObject *)self;
}

static int CountHook_traverse(CountHook *self, visitproc visit, void *arg) {
    Py_VISIT(self->template); Py_VISIT(self->fwd_stack);
    return 0;
}

static int CountHook_clear(CountHook *self) {
    Py_CLEAR(self->template); Py_CLEAR(self->fwd_stack);
    return 0;
}

static void CountHook_dealloc(CountHook *self) {
    PyObject_GC_UnTrack(self);
    CountHook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef CountHook_members[] = {
    {"template", T_OBJECT, offsetof(CountHook, template), READONLY, NULL},
    {"fwd_stack", T_OBJECT, offsetof(CountHook, fwd_stack), READONLY, NULL},
    {NULL},
};

PyTypeObject CountHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrumented_convs.core.native._speedups.CountHook",
    .tp_doc = "CountHook(template, fwd_stack): the hook that counts a backward not timed (see backward.sampling).",
    .tp_basicsize = sizeof(CountHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = CountHook_new,
    .tp_call = (ternaryfunc)CountHook_call,
    .tp_dealloc = (destructor)CountHook_dealloc,
    .tp_traverse = (traverseproc)CountHook_traverse,
    .tp_clear = (inquiry)CountHook_clear,
    .tp_members = CountHook_members,
};
