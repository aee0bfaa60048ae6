/* Anchors on the fast path: their logs (the node ranges of nested steps), and their exit:
 * choosing how the backward is timed and counting the common case without a Python frame
 * (see _speedups.h; the Python twins are anchor.Log, stepbase and anchor.finish). */
#include "_speedups.h"

/* -- an anchor's log ---------------------------------------------------------------------- */

/* anchor.Log(seq0, depth0), its slots filled here rather than by its Python __init__. */
PyObject *new_anchor_log(long long seq0, Py_ssize_t depth0) {
    PyTypeObject *t = (PyTypeObject *)g_log_type;
    PyObject *log = t->tp_alloc(t, 0);
    if (log == NULL) return NULL;
    PyObject *s = PyLong_FromLongLong(seq0), *d = PyLong_FromSsize_t(depth0);
    PyObject *items = PyList_New(0), *outs = PyList_New(0);
    SLOT(log, o_seq0) = s; SLOT(log, o_depth0) = d; SLOT(log, o_items) = items; SLOT(log, o_outputs) = outs;
    if (!s || !d || !items || !outs) { Py_DECREF(log); return NULL; }
    return log;
}

/* Log a nested step's node range in its anchor's log (see anchor.Log). */
int log_inner(Frame *frame, Py_ssize_t depth, PyObject *entry) {
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
            PyErr_SetString(PyExc_TypeError, "instrumented_convs: a step's log is not an anchor.Log");
        } else {
            long long base = PyLong_AsLongLong(b);
            Py_ssize_t dd = PyLong_AsSsize_t(d0);
            PyObject *item = PyErr_Occurred() ? NULL : PyTuple_New(5);
            if (item != NULL) {  /* (seq0, seq1, entry, depth, mode), relative to the anchor */
                PyObject *v0 = PyLong_FromLongLong(seq0 - base), *v1 = PyLong_FromLongLong(seq1 - base);
                PyObject *v3 = PyLong_FromSsize_t(depth - dd), *v4 = PyLong_FromLong(frame->mode);
                PyTuple_SET_ITEM(item, 0, v0); PyTuple_SET_ITEM(item, 1, v1);
                PyTuple_SET_ITEM(item, 2, Py_NewRef(entry));
                PyTuple_SET_ITEM(item, 3, v3); PyTuple_SET_ITEM(item, 4, v4);
                if (!v0 || !v1 || !v3 || !v4) Py_CLEAR(item);
            }
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


/* -- an anchor's exit: the common case of anchor.log_exit and finish ------------------------ */

/* What bind_anchor() hands over (see anchor_exit). */
static PyObject *g_tensor_type, *g_template_type, *g_sampling_mod, *g_chosen, *g_failed, *g_count_hook;
static PyObject *g_odict, *g_keys, *g_key_tag, *g_anchor_mod;
static Py_ssize_t o_sampling = -1, o_calls = -1, o_records = -1;
static PyObject *s_every, *s_random, *s_grad_fn, *s_seq_m, *s_hooks, *s_reg_dict, *s_fast_exit;

/* A module global's truth; 0 (and no exception) when it is missing or its truth fails. */
static int module_flag_quiet(PyObject *mod, PyObject *name) {
    int r = module_flag(mod, name);
    if (r < 0) { PyErr_Clear(); return 0; }
    return r;
}

PyObject *bind_anchor(PyObject *mod, PyObject *args) {
    PyObject *entry_t, *tensor_t, *template_t, *sampling, *anchor, *chosen, *failed, *count_hook, *odict, *keys, *tag;
    if (!PyArg_ParseTuple(args, "OOOO!O!OOOOOO", &entry_t, &tensor_t, &template_t, &PyModule_Type, &sampling,
                          &PyModule_Type, &anchor, &chosen, &failed, &count_hook, &odict, &keys, &tag))
        return NULL;
    o_sampling = slot_offset(entry_t, "sampling");
    o_calls = slot_offset(template_t, "calls");
    o_records = slot_offset(template_t, "records");
    if (o_sampling < 0 || o_calls < 0 || o_records < 0) {
        PyErr_SetString(PyExc_TypeError, "Entry and Template must be classes with __slots__ (see anchor_exit)");
        return NULL;
    }
#define INTERN(var, text) if (var == NULL && (var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_every, "backward_every"); INTERN(s_random, "_random"); INTERN(s_grad_fn, "grad_fn");
    INTERN(s_seq_m, "_sequence_nr"); INTERN(s_hooks, "_backward_hooks"); INTERN(s_reg_dict, "_register_hook_dict");
    INTERN(s_fast_exit, "fast_exit");
#undef INTERN
    Py_XSETREF(g_tensor_type, Py_NewRef(tensor_t)); Py_XSETREF(g_template_type, Py_NewRef(template_t));
    Py_XSETREF(g_sampling_mod, Py_NewRef(sampling)); Py_XSETREF(g_anchor_mod, Py_NewRef(anchor)); Py_XSETREF(g_failed, Py_NewRef(failed));
    Py_XSETREF(g_count_hook, Py_NewRef(count_hook)); Py_XSETREF(g_odict, Py_NewRef(odict));
    Py_XSETREF(g_keys, Py_NewRef(keys)); Py_XSETREF(g_key_tag, Py_NewRef(tag));
    Py_XSETREF(g_chosen, Py_NewRef(chosen));  /* last: anchor_exit runs once this is set */
    Py_RETURN_NONE;
}

/* Hand the exception set to anchor.failed (which logs it) and clear it. */
static void report_failure(PyObject *entry) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb != NULL && ev != NULL) PyException_SetTraceback(ev, tb);
    PyObject *r = PyObject_CallFunctionObjArgs(g_failed, entry, ev ? ev : Py_None, NULL);
    if (r == NULL) PyErr_Clear(); else Py_DECREF(r);
    Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
}

/* An attribute (a switch of core.settings.switches, or a module global) as a C integer; 0 and
 * no exception when it is missing or not an int. */
static long long module_int(PyObject *mod, PyObject *name, int *ok) {
    PyObject *v = PyObject_GetAttr(mod, name);  /* new reference */
    *ok = 0;
    if (v == NULL || !PyLong_CheckExact(v)) { Py_XDECREF(v); PyErr_Clear(); return 0; }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    *ok = 1;
    return x;
}

/* At an anchor's exit on the fast path: sampling.choose, and the count of a call whose one
 * output is the anchor's newest node, without a Python frame; a call chosen for timing goes
 * to anchor.chosen. Returns 1 when done (a failure after the choice is logged through
 * anchor.failed), 0 when this is not the common case and nothing was changed (the call of
 * the template has not been counted, no hook set): then anchor.log_exit does all of it. */
int anchor_exit(Frame *frame, PyObject *stack, PyObject *entry) {
    if (g_chosen == NULL || !module_flag_quiet(g_anchor_mod, s_fast_exit)) return 0;
    PyObject *log = frame->log, *outputs = frame->outputs, *sampling = SLOT(entry, o_sampling);
    if (log == NULL || (PyObject *)Py_TYPE(log) != g_log_type || outputs == NULL
        || (PyObject *)Py_TYPE(outputs) != g_tensor_type || sampling == NULL || !PyDict_CheckExact(sampling))
        return 0;
    PyObject *items = SLOT(log, o_items), *b = SLOT(log, o_seq0);
    if (items == NULL || !PyList_CheckExact(items) || b == NULL) return 0;
    int ok;
    long long every = module_int(g_config, s_every, &ok);
    if (!ok) return 0;
    long long base = PyLong_AsLongLong(b), seq1 = seq_nr();
    if ((base == -1 || seq1 == -1) && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    if (seq1 == frame->seq0) return 0;
    /* Strong references from here: the Python calls below (grad_fn, the draw) run no step, but
     * nothing borrowed is relied on across them. */
    PyObject *shape = NULL, *t = NULL, *records = NULL, *node = NULL, *hooks = NULL, *rnd = NULL, *draw = NULL;
    int done = 0;
    Py_INCREF(log); Py_INCREF(outputs);
    PyObject *rel = PyLong_FromLongLong(seq1 - base), *mode = PyLong_FromLong(frame->mode);
    PyObject *its = PyList_AsTuple(items);
    if (rel && mode && its) shape = PyTuple_Pack(3, rel, mode, its);
    Py_XDECREF(rel); Py_XDECREF(mode); Py_XDECREF(its);
    if (shape == NULL) goto pass;
    t = PyDict_GetItemWithError(sampling, shape);
    if (t == NULL || (PyObject *)Py_TYPE(t) != g_template_type) { t = NULL; goto pass; }
    Py_INCREF(t);
    PyObject *calls_o = SLOT(t, o_calls);  /* read here, written back below: no Python call between */
    if (calls_o == NULL || !PyLong_CheckExact(calls_o)) goto pass;
    long long calls = PyLong_AsLongLong(calls_o);
    if ((calls == -1 && PyErr_Occurred()) || calls + 1 <= every) goto pass;  /* the census: Python */
    node = PyObject_GetAttr(outputs, s_grad_fn);
    if (node == NULL || node == Py_None) goto pass;
    PyObject *s = PyObject_CallMethodNoArgs(node, s_seq_m);
    long long ns = s ? PyLong_AsLongLong(s) : -1;
    Py_XDECREF(s);
    if (ns != seq1 - 1) goto pass;  /* not the anchor's newest node: Python looks further */
    hooks = PyObject_GetAttr(outputs, s_hooks);
    rnd = PyDict_GetItemWithError(PyModule_GetDict(g_sampling_mod), s_random);
    if (hooks == NULL || rnd == NULL) { rnd = NULL; goto pass; }
    Py_INCREF(rnd);
    draw = PyObject_CallNoArgs(rnd);
    double r = draw ? PyFloat_AsDouble(draw) : -1.0;
    if (draw == NULL || (r == -1.0 && PyErr_Occurred())) goto pass;
    calls_o = SLOT(t, o_calls);
    records = SLOT(t, o_records);
    if (calls_o == NULL || !PyLong_CheckExact(calls_o) || PyLong_AsLongLong(calls_o) != calls
        || records == NULL || !PyTuple_CheckExact(records)) { records = NULL; goto pass; }
    Py_INCREF(records);
    /* Chosen: from here on this call is counted or timed, never handed back. */
    PyObject *next = PyLong_FromLongLong(calls + 1);
    if (next == NULL) goto pass;
    Py_SETREF(SLOT(t, o_calls), next);
    done = 1;
    Py_CLEAR(frame->log); Py_CLEAR(frame->outputs);
    frame->seq0 = -1;
    int fail = 0;
    if (r * (double)every < 1.0) {  /* SAMPLED: time this call step by step (Python walks) */
        PyObject *x = PyObject_CallFunction(g_chosen, "OLOiOOOOi", log, seq1, entry, frame->mode, outputs, stack,
                                            shape, t, 1);
        fail = x == NULL;
        Py_XDECREF(x);
    } else if (PyTuple_GET_SIZE(records) > 0) {  /* COUNT (sampling.count) */
        if (hooks == Py_None) {  /* the tensor's own hook dict, registered on its node once */
            Py_SETREF(hooks, PyObject_CallNoArgs(g_odict));
            PyObject *x = NULL;
            fail = hooks == NULL || PyObject_SetAttr(outputs, s_hooks, hooks) < 0
                || (x = PyObject_CallMethodOneArg(node, s_reg_dict, outputs)) == NULL;
            Py_XDECREF(x);
        }
        if (!fail) {
            PyObject *n = PyIter_Next(g_keys), *key = n ? PyTuple_Pack(2, g_key_tag, n) : NULL;
            PyObject *hook = key ? PyObject_CallFunctionObjArgs(g_count_hook, t, stack, NULL) : NULL;
            fail = hook == NULL || PyObject_SetItem(hooks, key, hook) < 0;
            Py_XDECREF(n); Py_XDECREF(key); Py_XDECREF(hook);
        }
    }
    if (fail) report_failure(entry);
pass:
    if (!done) PyErr_Clear();
    Py_DECREF(log); Py_DECREF(outputs);
    Py_XDECREF(shape); Py_XDECREF(t); Py_XDECREF(records); Py_XDECREF(node); Py_XDECREF(hooks);
    Py_XDECREF(rnd); Py_XDECREF(draw);
    return done;
}
