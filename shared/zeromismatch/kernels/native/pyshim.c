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

#define MAX_ARGS 24

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
#define DEFINE(NAME, SIG, STATEMENT, IS_VOID)                                                         \
    static const char sig_##NAME[] = SIG;                                                              \
    static PyObject *py_##NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {              \
        int64_t a[MAX_ARGS];                                                                           \
        double f[MAX_ARGS];                                                                            \
        int rc = 0;                                                                                    \
        (void)self;                                                                                    \
        if (parse(#NAME, args, nargs, sig_##NAME, a, f)) return NULL;                                  \
        Py_BEGIN_ALLOW_THREADS STATEMENT;                                                              \
        Py_END_ALLOW_THREADS if (IS_VOID) Py_RETURN_NONE;                                              \
        return PyLong_FromLong(rc);                                                                    \
    }
#define DEFINE_INT(NAME, SIG, CALL) DEFINE(NAME, SIG, rc = CALL, 0)
#define DEFINE_VOID(NAME, SIG, CALL) DEFINE(NAME, SIG, CALL, 1)

DEFINE_INT(zm_panel_gemm, "pLpLLiLLLiipi",
           zm_panel_gemm(P(0), L(1), P(2), L(3), L(4), I(5), L(6), L(7), L(8), I(9), I(10), P(11), I(12)))
DEFINE_INT(zm_panel_gemm_reduced, "pLpLLiLLLipii",
           zm_panel_gemm_reduced(P(0), L(1), P(2), L(3), L(4), I(5), L(6), L(7), L(8), I(9), P(10), I(11), I(12)))
DEFINE_INT(zm_attention, "pppiipLpLLpppLLLLLfpi",
           zm_attention(P(0), P(1), P(2), I(3), I(4), P(5), L(6), P(7), L(8), L(9), P(10), P(11), P(12), L(13),
                        L(14), L(15), L(16), L(17), F(18), P(19), I(20)))
DEFINE_INT(zm_ssm_scan, "ppppppppppppLLLLLffi",
           zm_ssm_scan(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), P(10), P(11), L(12), L(13), L(14),
                       L(15), L(16), F(17), F(18), I(19)))
DEFINE_VOID(zm_rms_norm, "piLLLLLLipifpii",
            zm_rms_norm(P(0), I(1), L(2), L(3), L(4), L(5), L(6), L(7), I(8), P(9), I(10), F(11), P(12), I(13),
                        I(14)))
DEFINE_INT(zm_rope, "piLLLLLppLipi",
           zm_rope(P(0), I(1), L(2), L(3), L(4), L(5), L(6), P(7), P(8), L(9), I(10), P(11), I(12)))
DEFINE_INT(zm_moe_experts, "piLLppLLLipLLipLLipi",
           zm_moe_experts(P(0), I(1), L(2), L(3), P(4), P(5), L(6), L(7), L(8), I(9), P(10), L(11), L(12), I(13),
                          P(14), L(15), L(16), I(17), P(18), I(19)))
DEFINE_INT(zm_causal_conv1d, "piLLpLppLpippi",
           zm_causal_conv1d(P(0), I(1), L(2), L(3), P(4), L(5), P(6), P(7), L(8), P(9), I(10), P(11), P(12),
                            I(13)))
DEFINE_VOID(zm_uniform_rows, "pLLp", zm_uniform_rows(P(0), L(1), L(2), P(3)))
DEFINE_VOID(zm_silu_mul, "ppiLLLLpi", zm_silu_mul(P(0), P(1), I(2), L(3), L(4), L(5), L(6), P(7), I(8)))

/* each function's docstring is its signature string, which _build.SIGNATURES must equal (tested) */
#define METHOD(NAME) {#NAME, (PyCFunction)(void (*)(void))py_##NAME, METH_FASTCALL, sig_##NAME}
static PyMethodDef methods[] = {
    METHOD(zm_panel_gemm), METHOD(zm_attention),     METHOD(zm_ssm_scan),      METHOD(zm_rms_norm),
    METHOD(zm_rope),       METHOD(zm_moe_experts),   METHOD(zm_causal_conv1d), METHOD(zm_uniform_rows),
    METHOD(zm_silu_mul),   METHOD(zm_panel_gemm_reduced), {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "zm_native", NULL, -1, methods,
                                    NULL,                  NULL,        NULL, NULL};

PyMODINIT_FUNC PyInit_zm_native(void) { return PyModule_Create(&module); }
