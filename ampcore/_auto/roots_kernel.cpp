// The settled path of a level="auto" root call in C (ampcore/_auto/_kernel.py builds it at
// first use; ampcore/_auto/_roots.py is the Python path it mirrors and falls back to).
//
// sentinel(module, args, kwargs=None): the global forward pre-hook of an eligible region.  It
// carries out only the settled call of a program that hooks no module (Running.simple), for
// tensor positional arguments, no keyword arguments, no loosened numbers and no plain
// containers of layers; every check is the one of _roots._sentinel, read without side
// effects, and any other case (or any check that fails) calls the Python sentinel with the
// same arguments, which decides it from the start.
// post(module, args, output=None): the root's post-hook; the simple stop, else the Python one.
//
// Plain CPython API (no torch headers): it builds in seconds, and reads tensors' shape, dtype
// and device through their Python attributes, as the Python guard does.

#include <Python.h>

#define AMP_STR2(x) #x
#define AMP_STR(x) AMP_STR2(x)
#define AMP_CAT2(a, b) a##b
#define AMP_CAT(a, b) AMP_CAT2(a, b)

namespace {

// Python objects given by configure() (owned references, kept for the process).
enum Slot {
    PROG, LOCAL, THREAD, PLANS, COMPILER, GLOBAL_PRE, PY_SENTINEL, PY_POST, SENTINEL_OFF,
    SENTINEL_ON, GRAD_ENABLED, NUM_THREADS, AUTOCAST_ENABLED, SET_AUTOCAST, TENSOR, FLOAT32,
    LAST_TYPE, PROCESS, DYNAMO_READY, PY_ENTERED, PY_EXITED, HOOK_PUBLIC, MODULE_TYPE,
    REGION_THREADS, SELF_POST, SELF_SENTINEL, N_SLOTS
};
PyObject* slots[N_SLOTS];

// Interned attribute names.
enum Name {
    settled, run, rec, measuring, _is_compiling_flag, stack, spec, backend, device_type, last,
    generation, threads, ref, plan, changes, stale, simple, switches_root, plain, sig, training,
    __dict__, shape, dtype, device, tree, values, weights, sentinel, sentinel_key, public_, key,
    _forward_hooks, _forward_hooks_always_called, root, region, default_fp32, loose, eval_,
    name, owner, device_index, plans, policy, site_code, site_line, site, overflow, roots,
    entered, _forward_pre_hooks_with_kwargs, called, remove, N_NAMES
};
const char* name_text[N_NAMES] = {
    "settled", "run", "rec", "measuring", "_is_compiling_flag", "stack", "spec", "backend",
    "device_type", "last", "generation", "threads", "ref", "plan", "changes", "stale", "simple",
    "switches_root", "plain", "sig", "training", "__dict__", "shape", "dtype", "device", "tree",
    "values", "weights", "sentinel", "sentinel_key", "public", "key", "_forward_hooks",
    "_forward_hooks_always_called", "root", "region", "default_fp32", "_ampcore_auto_loose", "eval",
    "name", "owner", "device_index", "plans", "policy", "site_code", "site_line", "site", "overflow",
    "roots", "entered", "_forward_pre_hooks_with_kwargs", "called", "remove",
};
PyObject* names[N_NAMES];
bool configured = false;
bool dynamo_seen = false;  // torch._dynamo was imported and DYNAMO_READY was called

// Once torch._dynamo is imported, DYNAMO_READY gives its traces the Python hooks in place of
// these (a builtin it cannot trace would break the graph at every module call).
int check_dynamo() {
    if (dynamo_seen || PyDict_GetItemString(PyImport_GetModuleDict(), "torch._dynamo") == nullptr) return 0;
    dynamo_seen = true;
    PyObject* done = PyObject_CallNoArgs(slots[DYNAMO_READY]);  // before call_slot's definition
    Py_XDECREF(done);
    return done == nullptr ? -1 : 0;
}

// A new reference to obj.<name>, or NULL with the error cleared (a missing attribute is a miss).
PyObject* get(PyObject* obj, Name n) {
    PyObject* value = PyObject_GetAttr(obj, names[n]);
    if (value == nullptr) PyErr_Clear();
    return value;
}

// Whether obj.<name> is true (a failed read or test: false, error cleared).
bool truth(PyObject* obj, Name n) {
    PyObject* value = get(obj, n);
    if (value == nullptr) return false;
    int result = PyObject_IsTrue(value);
    Py_DECREF(value);
    if (result < 0) PyErr_Clear();
    return result == 1;
}

// Whether obj.<name> is None (a failed read: false).
bool is_none(PyObject* obj, Name n) {
    PyObject* value = get(obj, n);
    if (value == nullptr) return false;
    Py_DECREF(value);
    return value == Py_None;
}

// a == b as tuple comparison does it (identity first); an error is a difference.
bool equal(PyObject* a, PyObject* b) {
    int result = PyObject_RichCompareBool(a, b, Py_EQ);
    if (result < 0) PyErr_Clear();
    return result == 1;
}

// obj.<name> == expected (an error or a missing attribute: false).
bool attr_equal(PyObject* obj, Name n, PyObject* expected) {
    PyObject* value = get(obj, n);
    if (value == nullptr) return false;
    bool same = equal(value, expected);
    Py_DECREF(value);
    return same;
}

// Holds new references and drops them at the end of a scope.
struct Refs {
    PyObject* held[24];
    int count = 0;
    PyObject* keep(PyObject* obj) {
        if (obj != nullptr) held[count++] = obj;
        return obj;
    }
    ~Refs() {
        while (count > 0) Py_DECREF(held[--count]);
    }
};

// The tensor arguments against the program's signature (grad mode, then (shape, dtype,
// device) of each argument, then "eval" where the root is not training).
bool same_signature(PyObject* module, PyObject* args, PyObject* sig) {
    if (!PyTuple_CheckExact(sig) || !PyTuple_CheckExact(args)) return false;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject* dict = get(module, __dict__);
    if (dict == nullptr) return false;
    bool has_loose = PyDict_Check(dict) && PyDict_GetItemWithError(dict, names[loose]) != nullptr;
    Py_DECREF(dict);
    if (has_loose || PyErr_Occurred()) {
        PyErr_Clear();
        return false;  // numbers held by type: the Python guard
    }
    PyObject* training_value = get(module, training);
    if (training_value == nullptr) return false;
    int is_training = PyObject_IsTrue(training_value);
    Py_DECREF(training_value);
    if (is_training < 0) {
        PyErr_Clear();
        return false;
    }
    if (PyTuple_GET_SIZE(sig) != 1 + n + (is_training ? 0 : 1)) return false;
    PyObject* grad = PyObject_CallNoArgs(slots[GRAD_ENABLED]);
    if (grad == nullptr) {
        PyErr_Clear();
        return false;
    }
    bool same = equal(PyTuple_GET_ITEM(sig, 0), grad);
    Py_DECREF(grad);
    if (!same) return false;
    static const Name parts[3] = {shape, dtype, device};
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* arg = PyTuple_GET_ITEM(args, i);
        int tensor = PyObject_IsInstance(arg, slots[TENSOR]);
        PyObject* entry = PyTuple_GET_ITEM(sig, 1 + i);
        if (tensor != 1 || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3) {
            if (tensor < 0) PyErr_Clear();
            return false;
        }
        for (int p = 0; p < 3; ++p) {
            if (!attr_equal(arg, parts[p], PyTuple_GET_ITEM(entry, p))) return false;
        }
    }
    return is_training || equal(PyTuple_GET_ITEM(sig, 1 + n), names[eval_]);
}

// _guard.unchanged(tree, values, weights) for a root without plain containers of layers.
bool same_tree(PyObject* last_entry) {
    Refs refs;
    PyObject* ws = refs.keep(get(last_entry, weights));
    PyObject* tr = refs.keep(get(last_entry, tree));
    PyObject* vs = refs.keep(get(last_entry, values));
    if (ws == nullptr || tr == nullptr || vs == nullptr) return false;
    if (!PyTuple_CheckExact(ws) || !PyTuple_CheckExact(tr) || !PyList_CheckExact(vs)) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ws); ++i) {
        PyObject* dt = get(PyTuple_GET_ITEM(ws, i), dtype);
        if (dt == nullptr) return false;
        Py_DECREF(dt);
        if (dt != slots[FLOAT32]) return false;
    }
    if (PyTuple_GET_SIZE(tr) != PyList_GET_SIZE(vs)) return false;  // zip(strict=True) raises: Python
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tr); ++i) {
        PyObject* modules = PyTuple_GET_ITEM(tr, i);
        PyObject* was = PyList_GET_ITEM(vs, i);
        if (!PyDict_CheckExact(modules) || !PyTuple_CheckExact(was)) return false;
        if (PyDict_GET_SIZE(modules) != PyTuple_GET_SIZE(was)) return false;
        Py_ssize_t pos = 0, j = 0;
        PyObject *k, *v;
        while (PyDict_Next(modules, &pos, &k, &v)) {
            if (!equal(v, PyTuple_GET_ITEM(was, j++))) return false;
        }
    }
    return true;
}

// _roots._same_plan where _hooks.plan_of finds the region's plan with its one lookup: whether
// the plan of `region` (another region object than the entry's) is the entry's, which is then
// remembered as the entry's spec, as in Python.  False where plan_of would do more.
bool same_plan(PyObject* entry, PyObject* region, PyObject* sp, PyObject* be, PyObject* gen, PyObject* nthreads) {
    Refs refs;
    PyObject* backend_name = refs.keep(get(be, name));
    PyObject* dt = refs.keep(get(sp, dtype));
    PyObject* own = refs.keep(get(region, owner));
    if (backend_name == nullptr || dt == nullptr || own == nullptr) return false;
    PyObject* index = refs.keep(get(own, device_index));  // getattr(owner, "device_index", None) or 0
    int truthy = index == nullptr ? 0 : PyObject_IsTrue(index);
    if (truthy < 0) return false;
    PyObject* zero = refs.keep(PyLong_FromLong(0));
    PyObject* k = refs.keep(PyTuple_Pack(4, backend_name, truthy ? index : zero, dt, nthreads));
    PyObject* table = refs.keep(get(slots[PROCESS], plans));
    if (k == nullptr || table == nullptr || !PyDict_CheckExact(table)) return false;
    PyObject* found = PyDict_GetItemWithError(table, k);  // borrowed: (generation, plan)
    if (found == nullptr || !PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 2) return false;
    if (!equal(PyTuple_GET_ITEM(found, 0), gen)) return false;
    PyObject* entry_plan = refs.keep(get(entry, plan));
    if (entry_plan == nullptr || PyTuple_GET_ITEM(found, 1) != entry_plan) return false;
    return PyObject_SetAttr(entry, names[spec], sp) == 0;
}

// The checks of _roots._sentinel's settled call of a simple program (no side effects): the
// root's _Last (a new reference) when they all hold, else NULL.
PyObject* settled_last(PyObject* module, PyObject* args, PyObject* kwargs, PyObject* region) {
    PyObject* prog = slots[PROG];
    if (!is_none(prog, run) || !is_none(prog, rec) || truth(prog, measuring)) return nullptr;
    if (truth(slots[COMPILER], _is_compiling_flag)) return nullptr;
    if (!PyDict_CheckExact(kwargs) || PyDict_GET_SIZE(kwargs) != 0) return nullptr;
    Refs refs;
    PyObject* st = refs.keep(get(slots[THREAD], stack));
    if (st == nullptr || !PyList_CheckExact(st) || PyList_GET_SIZE(st) == 0) return nullptr;
    if (PyList_GET_ITEM(st, PyList_GET_SIZE(st) - 1) != region) return nullptr;
    PyObject* sp = refs.keep(get(region, spec));
    PyObject* be = sp == nullptr ? nullptr : refs.keep(get(sp, backend));
    PyObject* dev = be == nullptr ? nullptr : refs.keep(get(be, device_type));
    if (dev == nullptr) return nullptr;
    PyObject* on = refs.keep(PyObject_CallOneArg(slots[AUTOCAST_ENABLED], dev));
    if (on != Py_True) return nullptr;
    PyObject* table = refs.keep(get(slots[LOCAL], last));
    PyObject* id = refs.keep(PyLong_FromVoidPtr(module));
    if (table == nullptr || id == nullptr || !PyDict_CheckExact(table)) return nullptr;
    PyObject* entry = PyDict_GetItemWithError(table, id);  // borrowed
    if (entry == nullptr || Py_TYPE(entry) != (PyTypeObject*)slots[LAST_TYPE]) return nullptr;
    PyObject* gen = refs.keep(get(slots[PLANS], generation));
    PyObject* nthreads = refs.keep(PyObject_CallNoArgs(slots[NUM_THREADS]));
    if (gen == nullptr || nthreads == nullptr) return nullptr;
    if (!attr_equal(entry, generation, gen) || !attr_equal(entry, threads, nthreads)) return nullptr;
    PyObject* entry_spec = refs.keep(get(entry, spec));
    if (entry_spec != sp && !same_plan(entry, region, sp, be, gen, nthreads)) return nullptr;
    PyObject* wref = refs.keep(get(entry, ref));
    PyObject* alive = wref == nullptr ? nullptr : refs.keep(PyObject_CallNoArgs(wref));
    if (alive != module) return nullptr;
    PyObject* pl = refs.keep(get(entry, plan));
    PyObject* now = pl == nullptr ? nullptr : refs.keep(get(pl, changes));
    if (now == nullptr || !attr_equal(entry, changes, now)) return nullptr;
    PyObject* st_flag = refs.keep(get(entry, stale));
    if (st_flag == nullptr || !PyList_CheckExact(st_flag) || PyList_GET_SIZE(st_flag) < 1) return nullptr;
    int is_stale = PyObject_IsTrue(PyList_GET_ITEM(st_flag, 0));
    if (is_stale != 0 || truth(entry, switches_root) || truth(entry, plain)) return nullptr;
    PyObject* r = refs.keep(get(entry, run));
    if (r == nullptr || r == Py_None || !truth(r, simple)) return nullptr;
    PyObject* s = refs.keep(get(entry, sig));
    if (s == nullptr || !same_signature(module, args, s) || !same_tree(entry)) return nullptr;
    if (PyErr_Occurred()) PyErr_Clear();
    Py_INCREF(entry);
    return entry;
}

// Calls one of the Python functions of slots: 0, or -1 with its exception set.
int call_slot(Slot slot) {
    PyObject* done = PyObject_CallNoArgs(slots[slot]);
    Py_XDECREF(done);
    return done == nullptr ? -1 : 0;
}

PyObject* delegate(PyObject* fn, PyObject* const* args, Py_ssize_t nargs) {
    return PyObject_Vectorcall(fn, args, nargs, nullptr);
}

// Sets a hook-dict item of module.<dict_name> (pop when value is NULL); false on an error.
bool hook_dict(PyObject* module, Name dict_name, PyObject* k, PyObject* value) {
    PyObject* d = get(module, dict_name);
    if (d == nullptr) return false;
    int result = 0;
    if (value != nullptr) {
        result = PyObject_SetItem(d, k, value);
    } else {  // torch's hook dicts are OrderedDicts: through their own methods
        result = PyObject_DelItem(d, k);
        if (result < 0 && PyErr_ExceptionMatches(PyExc_KeyError)) {
            PyErr_Clear();
            result = 0;
        }
    }
    Py_DECREF(d);
    return result == 0;
}

bool is_public(PyObject* module) {
    PyObject* pub = get(slots[LOCAL], public_);
    PyObject* id = PyLong_FromVoidPtr(module);
    int found = (pub != nullptr && id != nullptr) ? PySet_Contains(pub, id) : -1;
    Py_XDECREF(pub);
    Py_XDECREF(id);
    return found != 0;  // an error: as public (torch's own handles, nothing of ours to pop)
}

// The sentinel's switch-off (its global key out), as _roots._sentinel does it.
int sentinel_off() {
    PyObject* local = slots[LOCAL];
    PyObject* current = get(local, sentinel);
    PyObject* skey = get(local, sentinel_key);
    int result = 0;
    if (current != nullptr && current == skey && slots[GLOBAL_PRE] != Py_None) {
        if (PyObject_DelItem(slots[GLOBAL_PRE], skey) < 0) PyErr_Clear();  // an OrderedDict
        result = PyObject_SetAttr(local, names[sentinel], Py_None);
    } else {
        result = call_slot(SENTINEL_OFF);
    }
    Py_XDECREF(current);
    Py_XDECREF(skey);
    return result;
}

// A program whose default is float32 turns autocast off for the root call (on: back on).
int default_set(PyObject* r, PyObject* on) {
    if (!truth(r, default_fp32)) return 0;
    PyObject* dev = get(r, device_type);
    PyObject* done = dev == nullptr ? nullptr : PyObject_CallFunctionObjArgs(slots[SET_AUTOCAST], dev, on, nullptr);
    Py_XDECREF(dev);
    Py_XDECREF(done);
    return done == nullptr ? -1 : 0;
}

// The root's post-hook for this call in its forward-hook dicts under the thread's key (or out).
int root_post_hook(PyObject* module, bool add) {
    PyObject* k = get(slots[LOCAL], key);
    bool ok = k != nullptr && hook_dict(module, _forward_hooks, k, add ? slots[SELF_POST] : nullptr) &&
              hook_dict(module, _forward_hooks_always_called, k, add ? Py_True : nullptr);
    Py_XDECREF(k);
    return ok ? 0 : -1;
}

PyObject* sentinel_fn(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (!configured) return PyErr_Format(PyExc_RuntimeError, "ampcore's auto kernel: not configured");
    if (check_dynamo() < 0) return nullptr;
    if (nargs != 3) return delegate(slots[PY_SENTINEL], args, nargs);
    PyObject* module = args[0];
    PyObject* region = get(slots[PROG], settled);
    if (region == nullptr || region == Py_None) {
        Py_XDECREF(region);
        return delegate(slots[PY_SENTINEL], args, nargs);
    }
    PyObject* entry = settled_last(module, args[1], args[2], region);
    if (entry == nullptr) {
        if (PyErr_Occurred()) PyErr_Clear();
        Py_DECREF(region);
        return delegate(slots[PY_SENTINEL], args, nargs);
    }
    PyObject* r = get(entry, run);
    Py_DECREF(entry);
    int ok = r == nullptr ? -1 : sentinel_off();
    if (ok == 0 && !is_public(module)) ok = root_post_hook(module, true);
    if (ok == 0) ok = PyObject_SetAttr(r, names[root], module);
    if (ok == 0) ok = PyObject_SetAttr(r, names[Name::region], region);
    if (ok == 0) ok = default_set(r, Py_False);
    if (ok == 0) ok = PyObject_SetAttr(slots[PROG], names[run], r);
    Py_XDECREF(r);
    Py_DECREF(region);
    if (ok != 0) return nullptr;
    Py_RETURN_NONE;
}

PyObject* post_fn(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (!configured) return PyErr_Format(PyExc_RuntimeError, "ampcore's auto kernel: not configured");
    if (check_dynamo() < 0) return nullptr;
    if (nargs < 2) return delegate(slots[PY_POST], args, nargs);
    PyObject* module = args[0];
    PyObject* prog = slots[PROG];
    PyObject* r = get(prog, run);
    if (r == nullptr || r == Py_None) {
        Py_XDECREF(r);
        Py_RETURN_NONE;
    }
    PyObject* owner = get(r, root);
    Py_XDECREF(owner);
    if (owner != module || !truth(r, simple)) {
        Py_DECREF(r);
        return owner == module ? delegate(slots[PY_POST], args, nargs) : (Py_INCREF(Py_None), Py_None);
    }
    PyObject* local = slots[LOCAL];
    int ok = PyObject_SetAttr(prog, names[run], Py_None);
    if (ok == 0 && !is_public(module)) ok = root_post_hook(module, false);
    PyObject* reg = ok == 0 ? get(r, region) : nullptr;
    if (reg == nullptr) ok = -1;
    if (ok == 0) ok = default_set(r, Py_True);
    if (ok == 0) ok = PyObject_SetAttr(r, names[root], Py_None);
    if (ok == 0) ok = PyObject_SetAttr(r, names[region], Py_None);
    Py_DECREF(r);
    if (ok == 0) {
        PyObject* now = get(prog, settled);
        bool restore = now != nullptr && now == reg && is_none(local, sentinel);
        Py_XDECREF(now);
        if (restore) {
            PyObject* skey = get(local, sentinel_key);
            if (skey != nullptr && slots[GLOBAL_PRE] != Py_None) {
                ok = PyObject_SetItem(slots[GLOBAL_PRE], skey, slots[SELF_SENTINEL]);
                if (ok == 0) ok = PyObject_SetAttr(local, names[sentinel], skey);
            } else {
                ok = call_slot(SENTINEL_ON);
            }
            Py_XDECREF(skey);
        }
    }
    Py_XDECREF(reg);
    if (ok != 0) return nullptr;
    Py_RETURN_NONE;
}

PyObject* configure_fn(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != SELF_POST) {
        PyErr_Format(PyExc_TypeError, "configure() takes %d arguments", (int)SELF_POST);
        return nullptr;
    }
    PyObject* mod_post = PyObject_GetAttrString(self, "post");
    PyObject* mod_sentinel = PyObject_GetAttrString(self, "sentinel");
    if (mod_post == nullptr || mod_sentinel == nullptr) return nullptr;
    for (int i = 0; i < SELF_POST; ++i) {
        Py_INCREF(args[i]);
        Py_XSETREF(slots[i], args[i]);
    }
    Py_XSETREF(slots[SELF_POST], mod_post);
    Py_XSETREF(slots[SELF_SENTINEL], mod_sentinel);
    configured = true;
    dynamo_seen = false;
    Py_RETURN_NONE;
}

// The site of an eligible region entered where the thread's last one was (_roots.region_entered's
// short way), a new reference; NULL (no error) for any other region: the Python way.
PyObject* known_site(PyObject* st, PyObject* region) {
    if (PyList_GET_SIZE(st) != 1 || truth(slots[COMPILER], _is_compiling_flag)) return nullptr;
    PyObject* sp = get(region, spec);
    bool plain = sp != nullptr && is_none(sp, policy);
    Py_XDECREF(sp);
    PyFrameObject* enter = PyEval_GetFrame();  // autocast.__enter__ (a C call has no frame)
    PyFrameObject* user = (plain && enter != nullptr) ? PyFrame_GetBack(enter) : nullptr;
    if (user == nullptr) return nullptr;
    PyCodeObject* code = PyFrame_GetCode(user);
    int line = PyFrame_GetLineNumber(user);
    Py_DECREF(user);
    PyObject* local = slots[LOCAL];
    PyObject* known = get(local, site_code);
    PyObject* known_line = get(local, site_line);
    bool same = known == (PyObject*)code && known_line != nullptr && PyLong_Check(known_line) &&
                PyLong_AsLong(known_line) == line;
    Py_DECREF(code);
    Py_XDECREF(known);
    Py_XDECREF(known_line);
    PyObject* found = same ? get(local, site) : nullptr;
    if (found != nullptr && (found == Py_None || truth(found, overflow))) Py_CLEAR(found);
    if (PyErr_Occurred()) PyErr_Clear();
    return found;
}

// The root marks of _roots.region_entered: the sentinel's key in each live root's with-kwargs
// pre-hook dict (public hooks where those dicts are not there).
int mark_roots(PyObject* site_obj, PyObject* handles, PyObject* skey) {
    PyObject* refs = get(site_obj, roots);
    if (refs == nullptr || !PyList_CheckExact(refs)) {
        Py_XDECREF(refs);
        return -1;
    }
    int ok = 0;
    for (Py_ssize_t i = 0; ok == 0 && i < PyList_GET_SIZE(refs); ++i) {
        PyObject* module = PyObject_CallNoArgs(PyList_GET_ITEM(refs, i));
        if (module == nullptr || module == Py_None) {
            ok = module == nullptr ? -1 : 0;
            Py_XDECREF(module);
            continue;
        }
        if (hook_dict(module, _forward_pre_hooks_with_kwargs, skey, Py_True)) {
            ok = PyList_Append(handles, module);
        } else if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_AttributeError) &&
                   !PyErr_ExceptionMatches(PyExc_TypeError)) {
            ok = -1;
        } else {
            PyErr_Clear();
            PyObject* done = PyObject_CallFunctionObjArgs(slots[HOOK_PUBLIC], module, handles, nullptr);
            ok = done == nullptr ? -1 : 0;
            Py_XDECREF(done);
        }
        Py_DECREF(module);
    }
    Py_DECREF(refs);
    return ok;
}

PyObject* entered_fn(PyObject*, PyObject* const*, Py_ssize_t) {
    if (!configured) return PyErr_Format(PyExc_RuntimeError, "ampcore's auto kernel: not configured");
    if (check_dynamo() < 0) return nullptr;
    PyObject* st = get(slots[THREAD], stack);
    PyObject* region = (st != nullptr && PyList_CheckExact(st) && PyList_GET_SIZE(st) > 0)
                           ? PyList_GET_ITEM(st, PyList_GET_SIZE(st) - 1) : nullptr;
    PyObject* site_obj = region == nullptr || slots[GLOBAL_PRE] == Py_None ? nullptr : known_site(st, region);
    if (site_obj == nullptr) {
        Py_XDECREF(st);
        return PyObject_CallNoArgs(slots[PY_ENTERED]);
    }
    Py_INCREF(region);
    Py_DECREF(st);
    PyObject* local = slots[LOCAL];
    PyObject* handles = PyList_New(0);
    PyObject* entry = handles == nullptr ? nullptr : PyTuple_Pack(3, region, site_obj, handles);
    PyObject* list = get(local, entered);
    PyObject* skey = get(local, sentinel_key);
    PyObject* ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    int ok = (entry != nullptr && list != nullptr && skey != nullptr && ident != nullptr) ? 0 : -1;
    if (ok == 0) ok = PyObject_SetAttr(slots[PROG], names[settled], region);
    if (ok == 0) ok = PyList_Append(list, entry);
    if (ok == 0) ok = PyObject_SetItem(slots[REGION_THREADS], ident, Py_True);
    if (ok == 0) ok = mark_roots(site_obj, handles, skey);
    if (ok == 0) ok = PyObject_SetItem(slots[GLOBAL_PRE], skey, slots[SELF_SENTINEL]);
    if (ok == 0) ok = PyObject_SetAttr(local, names[sentinel], skey);
    Py_XDECREF(handles);
    Py_XDECREF(entry);
    Py_XDECREF(list);
    Py_XDECREF(skey);
    Py_XDECREF(ident);
    Py_DECREF(site_obj);
    Py_DECREF(region);
    if (ok != 0) return nullptr;
    Py_RETURN_NONE;
}

// The last entry of local.entered when _roots.region_exited's short way applies (a region
// with a site, no root call in progress, no roots new to the site), a new reference; else NULL.
PyObject* plain_exit(PyObject* list) {
    PyObject* local = slots[LOCAL];
    PyObject* prog = slots[PROG];
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) == 0) return nullptr;
    PyObject* entry = PyList_GET_ITEM(list, PyList_GET_SIZE(list) - 1);
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3 || PyTuple_GET_ITEM(entry, 1) == Py_None ||
        !PyList_CheckExact(PyTuple_GET_ITEM(entry, 2)))
        return nullptr;
    if (!is_none(prog, run) || !is_none(prog, rec) || truth(local, called) || truth(local, public_)) return nullptr;
    Py_INCREF(entry);
    return entry;
}

PyObject* exited_fn(PyObject*, PyObject* const*, Py_ssize_t) {
    if (!configured) return PyErr_Format(PyExc_RuntimeError, "ampcore's auto kernel: not configured");
    PyObject* local = slots[LOCAL];
    PyObject* list = get(local, entered);
    PyObject* entry = list == nullptr ? nullptr : plain_exit(list);
    if (entry == nullptr) {
        Py_XDECREF(list);
        if (PyErr_Occurred()) PyErr_Clear();
        return PyObject_CallNoArgs(slots[PY_EXITED]);
    }
    int ok = PyList_SetSlice(list, PyList_GET_SIZE(list) - 1, PyList_GET_SIZE(list), nullptr);
    Py_DECREF(list);
    PyObject* skey = get(local, sentinel_key);
    if (skey == nullptr) ok = -1;
    if (ok == 0) ok = sentinel_off();
    PyObject* handles = PyTuple_GET_ITEM(entry, 2);
    for (Py_ssize_t i = 0; ok == 0 && i < PyList_GET_SIZE(handles); ++i) {
        PyObject* handle = PyList_GET_ITEM(handles, i);
        int module = PyObject_IsInstance(handle, slots[MODULE_TYPE]);
        if (module == 1) {
            ok = hook_dict(handle, _forward_pre_hooks_with_kwargs, skey, nullptr) ? 0 : -1;
        } else {
            PyObject* done = module < 0 ? nullptr : PyObject_CallMethodNoArgs(handle, names[remove]);
            ok = done == nullptr ? -1 : 0;
            Py_XDECREF(done);
        }
    }
    PyObject* ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (ok == 0 && ident != nullptr && PyDict_Check(slots[REGION_THREADS])) {
        PyObject* gone = PyObject_CallMethod(slots[REGION_THREADS], "pop", "OO", ident, Py_None);
        ok = gone == nullptr ? -1 : 0;
        Py_XDECREF(gone);
    }
    if (ok == 0) ok = PyObject_SetAttr(slots[PROG], names[settled], Py_None);
    Py_XDECREF(ident);
    Py_XDECREF(skey);
    Py_DECREF(entry);
    if (ok != 0) return nullptr;
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"region_entered", (PyCFunction)(void (*)(void))entered_fn, METH_FASTCALL, "See _roots.region_entered."},
    {"region_exited", (PyCFunction)(void (*)(void))exited_fn, METH_FASTCALL, "See _roots.region_exited."},
    {"sentinel", (PyCFunction)(void (*)(void))sentinel_fn, METH_FASTCALL, "The settled root call (see _roots._sentinel)."},
    {"post", (PyCFunction)(void (*)(void))post_fn, METH_FASTCALL, "The root's post-hook (see _roots._root_post)."},
    {"configure", (PyCFunction)(void (*)(void))configure_fn, METH_FASTCALL, "Give the state objects."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, AMP_STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC AMP_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
    for (int i = 0; i < N_NAMES; ++i) {
        names[i] = PyUnicode_InternFromString(name_text[i]);
        if (names[i] == nullptr) return nullptr;
    }
    return PyModule_Create(&module_def);
}
