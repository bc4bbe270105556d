/* The native kernels' entry points as a CPython extension module (``zm_native``), compiled into the
 * same shared library as the kernels when Python's headers are present (_build.py).
 *
 * Why: ctypes converts each argument through its argtypes and builds a call frame with libffi,
 * ~2 us for gemm.c's 13 arguments; a METH_FASTCALL function takes ~0.2 us. At one row a native
 * GEMM computes in ~2.5 us, so ctypes was almost half of it (issue 3's M=1 rows). Each wrapper
 * takes exactly the ctypes call's arguments (Python ints for pointers, None for NULL; Python
 * numbers for floats, converted to float as ctypes converts them), releases the GIL as ctypes
 * does, and calls the same C function: nothing a kernel computes depends on which path called it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "entry_points.h"

#define MAX_ARGS 32

/* args -> a[] by sig: 'p' a pointer (int or None), 'i'/'L' an integer (__index__), 'f' a float (in f[]). */
static int parse(const char *name, PyObject *const *args, Py_ssize_t nargs, const char *sig, int64_t *a,
                 double *f) {
    const Py_ssize_t want = (Py_ssize_t)strlen(sig);
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    for (Py_ssize_t j = 0; j < nargs; j++) {
        PyObject *arg = args[j];
        if (sig[j] == 'f') {
            f[j] = PyFloat_AsDouble(arg);
            if (f[j] == -1.0 && PyErr_Occurred()) return -1;
        } else if (sig[j] == 'p' && arg == Py_None) {
            a[j] = 0;
        } else if (sig[j] == 'p' && !PyLong_Check(arg)) { /* as ctypes' c_void_p: an int address or None */
            PyErr_Format(PyExc_TypeError, "%s: argument %zd must be an address (int) or None, not %.80s", name, j,
                         Py_TYPE(arg)->tp_name);
            return -1;
        } else { /* an int, or anything with __index__ (as ctypes' integer types take); not a float */
            a[j] = PyLong_AsLongLong(arg);
            if (a[j] == -1 && PyErr_Occurred()) {
                if (PyErr_ExceptionMatches(PyExc_TypeError)) /* (an OverflowError keeps its own message) */
                    PyErr_Format(PyExc_TypeError, "%s: argument %zd must be an integer, not %.80s", name, j,
                                 Py_TYPE(arg)->tp_name);
                return -1;
            }
        }
    }
    return 0;
}

#define P(j) ((void *)(intptr_t)a[j])
#define I(j) ((int)a[j])
#define L(j) (a[j])
#define F(j) ((float)f[j])

/* DEFINE(name, sig, statement, is_void): a METH_FASTCALL wrapper running the statement (which sets rc
 * for a function returning int) without the GIL; it returns rc, or None for a void function */
#define DEFINE(NAME, SIG, STATEMENT, IS_VOID)                                                 \
    static const char sig_##NAME[] = SIG;                                                     \
    _Static_assert(sizeof(SIG) - 1 <= MAX_ARGS, #NAME " takes more than MAX_ARGS arguments"); \
    static PyObject *py_##NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {     \
        int64_t a[MAX_ARGS];                                                                  \
        double f[MAX_ARGS];                                                                   \
        int rc = 0;                                                                           \
        (void)self;                                                                           \
        if (parse(#NAME, args, nargs, sig_##NAME, a, f)) return NULL;                         \
        Py_BEGIN_ALLOW_THREADS STATEMENT;                                                     \
        Py_END_ALLOW_THREADS if (IS_VOID) Py_RETURN_NONE;                                     \
        return PyLong_FromLong(rc);                                                           \
    }
#define DEFINE_INT(NAME, SIG, CALL) DEFINE(NAME, SIG, rc = CALL, 0)
#define DEFINE_VOID(NAME, SIG, CALL) DEFINE(NAME, SIG, CALL, 1)

DEFINE_INT(zm_panel_gemm, "pLpLLiLLLiipi",
           zm_panel_gemm(P(0), L(1), P(2), L(3), L(4), I(5), L(6), L(7), L(8), I(9), I(10), P(11), I(12)))
DEFINE_INT(zm_panel_gemm_reduced, "pLpLLiLLLipii",
           zm_panel_gemm_reduced(P(0), L(1), P(2), L(3), L(4), I(5), L(6), L(7), L(8), I(9), P(10), I(11), I(12)))
DEFINE_INT(zm_attention, "pLppiipLpLLpppLLLLLfpi",
           zm_attention(P(0), L(1), P(2), P(3), I(4), I(5), P(6), L(7), P(8), L(9), L(10), P(11), P(12), P(13),
                        L(14), L(15), L(16), L(17), L(18), F(19), P(20), I(21)))
DEFINE_INT(zm_ssm_scan, "ppppppppppppppLLLLLLLLLffi",
           zm_ssm_scan(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), P(10), P(11), P(12), P(13),
                       L(14), L(15), L(16), L(17), L(18), L(19), L(20), L(21), L(22), F(23), F(24), I(25)))
DEFINE_VOID(zm_rms_norm, "piLLLLLLipifpii",
            zm_rms_norm(P(0), I(1), L(2), L(3), L(4), L(5), L(6), L(7), I(8), P(9), I(10), F(11), P(12), I(13),
                        I(14)))
DEFINE_INT(zm_rope, "piLLLLLppLipi",
           zm_rope(P(0), I(1), L(2), L(3), L(4), L(5), L(6), P(7), P(8), L(9), I(10), P(11), I(12)))
DEFINE_INT(zm_moe_experts, "piLLppLLLipLLipLLipi",
           zm_moe_experts(P(0), I(1), L(2), L(3), P(4), P(5), L(6), L(7), L(8), I(9), P(10), L(11), L(12), I(13),
                          P(14), L(15), L(16), I(17), P(18), I(19)))
DEFINE_INT(zm_causal_conv1d, "piLLpLppLpppippi",
           zm_causal_conv1d(P(0), I(1), L(2), L(3), P(4), L(5), P(6), P(7), L(8), P(9), P(10), P(11), I(12), P(13),
                            P(14), I(15)))
DEFINE_VOID(zm_uniform_rows, "pLLp", zm_uniform_rows(P(0), L(1), L(2), P(3)))
DEFINE_VOID(zm_race_argmax, "ppLLp", zm_race_argmax(P(0), P(1), L(2), L(3), P(4)))
DEFINE_VOID(zm_silu_mul, "ppiLLLLpi", zm_silu_mul(P(0), P(1), I(2), L(3), L(4), L(5), L(6), P(7), I(8)))
DEFINE_INT(zm_copy_rows, "pLpLpLpLLL", zm_copy_rows(P(0), L(1), P(2), L(3), P(4), L(5), P(6), L(7), L(8), L(9)))
DEFINE_VOID(zm_add_f32, "pppL", zm_add_f32(P(0), P(1), P(2), L(3)))
DEFINE_VOID(zm_copy_strided, "ppLLLLLLLLLLLLL",
            zm_copy_strided(P(0), P(1), L(2), L(3), L(4), L(5), L(6), L(7), L(8), L(9), L(10), L(11), L(12), L(13),
                            L(14)))
DEFINE_INT(zm_moe_route, "ppLLLLLiiifpp",
           zm_moe_route(P(0), P(1), L(2), L(3), L(4), L(5), L(6), I(7), I(8), I(9), F(10), P(11), P(12)))

/* ---- tensor-level calls ------------------------------------------------------------------------
 * One op whose whole one-row call is a few microseconds of Python reads its tensors here instead:
 * the same public attributes and methods the Python code reads (shape, dtype, is_cpu, is_neg(),
 * requires_grad, stride(), data_ptr(); torch.empty_like / torch.empty for the output), called from
 * C, which saves ~0.5 us of a ~3 us silu_mul (session 15). torch's objects come from bind_torch(),
 * which _build.py calls once per loaded library; until then these calls decline (return None). */

static struct {
    PyObject *tensor_type, *f32, *bf16, *empty_like, *empty, *grad_enabled, *num_threads, *empty_kwnames, *cpu;
    PyObject *shape, *dtype, *is_cpu, *is_neg, *requires_grad, *stride, *data_ptr;
} torch_refs;

static PyObject *bind_torch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bind_torch(Tensor, float32, bfloat16, empty_like, empty, "
                                         "is_grad_enabled, get_num_threads, cpu_device)");
        return NULL;
    }
    PyObject **slots[] = {&torch_refs.tensor_type, &torch_refs.f32,   &torch_refs.bf16,
                          &torch_refs.empty_like,  &torch_refs.empty, &torch_refs.grad_enabled,
                          &torch_refs.num_threads, &torch_refs.cpu};
    for (int j = 0; j < 8; j++) {
        Py_INCREF(args[j]);
        Py_XSETREF(*slots[j], args[j]);
    }
    const char *names[] = {"shape", "dtype", "is_cpu", "is_neg", "requires_grad", "stride", "data_ptr"};
    PyObject **name_slots[] = {&torch_refs.shape,   &torch_refs.dtype,         &torch_refs.is_cpu,
                               &torch_refs.is_neg,  &torch_refs.requires_grad, &torch_refs.stride,
                               &torch_refs.data_ptr};
    for (int j = 0; j < 7; j++)
        if (!*name_slots[j] && !(*name_slots[j] = PyUnicode_InternFromString(names[j]))) return NULL;
    if (!torch_refs.empty_kwnames && !(torch_refs.empty_kwnames = Py_BuildValue("(ss)", "dtype", "device")))
        return NULL;
    Py_RETURN_NONE;
}

/* 1 when obj.<name> is `want`, 0 when it is not, -1 with an exception; `call`: obj.<name>() instead */
static int attr_is(PyObject *obj, PyObject *name, int call, PyObject *want) {
    PyObject *v = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
    if (!v) return -1;
    const int same = v == want;
    Py_DECREF(v);
    return same;
}

/* obj.<name>() (a shape or stride tuple) as two int64s; 1 when it has two entries, 0 when not, -1 */
static int pair_of(PyObject *obj, PyObject *name, int call, int64_t *a, int64_t *b) {
    PyObject *t = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
    if (!t) return -1;
    int ok = PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 2;
    if (ok) {
        *a = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
        if (*a == -1 && PyErr_Occurred()) ok = -1;
        else {
            *b = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
            if (*b == -1 && PyErr_Occurred()) ok = -1;
        }
    }
    Py_DECREF(t);
    return ok;
}

static int64_t address_of(PyObject *tensor) { /* -1 with an exception */
    PyObject *v = PyObject_CallMethodNoArgs(tensor, torch_refs.data_ptr);
    if (!v) return -1;
    const int64_t address = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return address;
}

/* silu_mul_tensors(gate, up): swiglu.py's silu_mul for the case it is called in (two plain
 * torch.Tensor objects, 2-D, same shape, one dtype of fp32/bf16, CPU, rows of unit stride, no lazy
 * negation, no gradient to record), as a new contiguous tensor; None for any other input (the
 * caller takes its general path). Plain tensors only: a subclass's __torch_function__ would answer
 * the attribute reads and empty_like, so the buffer written here could be anything (found in
 * review: one returning a [1, 1] tensor was overrun). */
static PyObject *silu_mul_tensors(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "silu_mul_tensors(gate, up)");
        return NULL;
    }
    if (!torch_refs.f32) Py_RETURN_NONE;
    PyObject *gate = args[0], *up = args[1];
    if (Py_TYPE(gate) != (PyTypeObject *)torch_refs.tensor_type || Py_TYPE(up) != Py_TYPE(gate)) Py_RETURN_NONE;
    int64_t rows, cols, up_rows, up_cols, g_stride, g_inner, u_stride, u_inner;
    int r;
/* EXPR: 1 go on, 0 decline (None), -1 an exception is set */
#define ZM_TRY(EXPR)            \
    do {                        \
        r = (EXPR);             \
        if (r < 0) return NULL; \
        if (!r) Py_RETURN_NONE; \
    } while (0)
    ZM_TRY(pair_of(gate, torch_refs.shape, 0, &rows, &cols));
    ZM_TRY(pair_of(up, torch_refs.shape, 0, &up_rows, &up_cols));
    ZM_TRY(rows == up_rows && cols == up_cols && rows > 0 && cols > 0);
    PyObject *dtype = PyObject_GetAttr(gate, torch_refs.dtype);
    if (!dtype) return NULL;
    Py_DECREF(dtype); /* torch's dtypes are module-level singletons, held by torch_refs */
    ZM_TRY(dtype == torch_refs.f32 || dtype == torch_refs.bf16);
    ZM_TRY(attr_is(up, torch_refs.dtype, 0, dtype));
    ZM_TRY(attr_is(gate, torch_refs.is_cpu, 0, Py_True));
    ZM_TRY(attr_is(up, torch_refs.is_cpu, 0, Py_True));
    /* raw pointers: a lazily negated view shares un-negated storage */
    ZM_TRY(attr_is(gate, torch_refs.is_neg, 1, Py_False));
    ZM_TRY(attr_is(up, torch_refs.is_neg, 1, Py_False));
    PyObject *grad = PyObject_CallNoArgs(torch_refs.grad_enabled);
    if (!grad) return NULL;
    Py_DECREF(grad);
    if (grad != Py_False) { /* a gradient to record: the general path's autograd wrapper */
        ZM_TRY(attr_is(gate, torch_refs.requires_grad, 0, Py_False));
        ZM_TRY(attr_is(up, torch_refs.requires_grad, 0, Py_False));
    }
    ZM_TRY(pair_of(gate, torch_refs.stride, 1, &g_stride, &g_inner));
    ZM_TRY(pair_of(up, torch_refs.stride, 1, &u_stride, &u_inner));
    ZM_TRY(g_inner == 1 && u_inner == 1);
#undef ZM_TRY
    /* a contiguous gate's empty_like is contiguous, and cheaper than empty; not for other gates:
     * empty_like copies an overlapping view's stride order */
    PyObject *out;
    if (g_stride == cols) {
        out = PyObject_CallOneArg(torch_refs.empty_like, gate);
    } else {
        PyObject *call[4] = {PyLong_FromLongLong(rows), PyLong_FromLongLong(cols), dtype, torch_refs.cpu};
        out = call[0] && call[1] ? PyObject_Vectorcall(torch_refs.empty, call, 2, torch_refs.empty_kwnames) : NULL;
        Py_XDECREF(call[0]);
        Py_XDECREF(call[1]);
    }
    if (!out) return NULL;
    const int64_t g = address_of(gate), u = g == -1 ? -1 : address_of(up), o = u == -1 ? -1 : address_of(out);
    PyObject *threads_obj = o == -1 ? NULL : PyObject_CallNoArgs(torch_refs.num_threads);
    const long threads = threads_obj ? PyLong_AsLong(threads_obj) : -1;
    Py_XDECREF(threads_obj);
    if (PyErr_Occurred()) {
        Py_DECREF(out);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS zm_silu_mul((const void *)(intptr_t)g, (const void *)(intptr_t)u,
                                       dtype == torch_refs.bf16, rows, cols, g_stride, u_stride,
                                       (void *)(intptr_t)o, (int)threads);
    Py_END_ALLOW_THREADS return out;
}

/* each function's docstring is its signature string, which _build.SIGNATURES must equal (tested) */
#define METHOD(NAME) {#NAME, (PyCFunction)(void (*)(void))py_##NAME, METH_FASTCALL, sig_##NAME}
static PyMethodDef methods[] = {
    METHOD(zm_panel_gemm),
    METHOD(zm_attention),
    METHOD(zm_ssm_scan),
    METHOD(zm_rms_norm),
    METHOD(zm_rope),
    METHOD(zm_moe_experts),
    METHOD(zm_causal_conv1d),
    METHOD(zm_uniform_rows),
    METHOD(zm_silu_mul),
    METHOD(zm_panel_gemm_reduced),
    METHOD(zm_copy_rows),
    METHOD(zm_add_f32),
    METHOD(zm_moe_route),
    METHOD(zm_copy_strided),
    METHOD(zm_race_argmax),
    {"bind_torch", (PyCFunction)(void (*)(void))bind_torch, METH_FASTCALL,
     "torch's objects for the tensor-level calls"},
    {"silu_mul_tensors", (PyCFunction)(void (*)(void))silu_mul_tensors, METH_FASTCALL,
     "swiglu.py's silu_mul, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "zm_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_zm_native(void) { return PyModule_Create(&module); }
