/* Kafka's murmur2 partitioner, compiled: the producer calls it once per keyed record,
 * where the pure-Python version in partitioner.py costs about 4 us a key. Same results
 * (tests/client/test_partitioner.py checks both against Kafka's own test vectors). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static uint32_t murmur2_u32(const unsigned char *data, Py_ssize_t len)
{
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)len;
    Py_ssize_t end = len & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < end; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) |
                     ((uint32_t)data[i + 2] << 16) | ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (len & 3) {
    case 3:
        h ^= (uint32_t)data[end + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[end + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[end];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

/* The hash of a bytes-like object; -1 with an exception set when it is not one. */
static int hash_of(PyObject *obj, uint32_t *out)
{
    if (PyBytes_Check(obj)) {
        *out = murmur2_u32((const unsigned char *)PyBytes_AS_STRING(obj), PyBytes_GET_SIZE(obj));
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return -1;
    *out = murmur2_u32((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return 0;
}

static PyObject *py_murmur2(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint32_t h;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "murmur2(data) takes exactly one argument");
        return NULL;
    }
    if (hash_of(args[0], &h) < 0)
        return NULL;
    return PyLong_FromLong((long)(int32_t)h); /* signed, as Java's int */
}

static PyObject *py_murmur2_partition(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint32_t h;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "murmur2_partition(key, num_partitions)");
        return NULL;
    }
    long n = PyLong_AsLong(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "num_partitions must be positive");
        return NULL;
    }
    if (hash_of(args[0], &h) < 0)
        return NULL;
    return PyLong_FromLong((long)((h & 0x7fffffffu) % (unsigned long)n));
}

static PyMethodDef methods[] = {
    {"murmur2", (PyCFunction)(void (*)(void))py_murmur2, METH_FASTCALL,
     "Kafka's Utils.murmur2 of a bytes-like object, as a signed 32-bit int."},
    {"murmur2_partition", (PyCFunction)(void (*)(void))py_murmur2_partition, METH_FASTCALL,
     "toPositive(murmur2(key)) % num_partitions: Kafka's default partition of a key."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_murmur2", "Kafka's murmur2 partitioner.", -1, methods,
};

PyMODINIT_FUNC PyInit__murmur2(void)
{
    return PyModule_Create(&module);
}
