/* _recordsv2: the records section of an uncompressed Kafka RecordBatch v2 (the bytes after
 * its 61-byte header), encoded from and decoded to rows
 * (offset_delta, timestamp_delta, key, value, headers).
 *
 * Why C: this per-record loop is the producer's and the consumer's hot path; the same loop
 * in Python (zigzag varints byte by byte) is 35-60x slower. records_py.py is the pure-Python fallback with the same
 * behaviour (same results, same exception types); tests check the two against each other.
 *
 * Record: length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
 * keyLength varint (-1 = null), key, valueLength varint (-1 = null), value, headersCount
 * varint, then per header: keyLength varint, UTF-8 key, valueLength varint (-1 = null), value.
 * Varints are zigzag base-128. decode_rows is fed bytes from the network: every read is
 * bounds-checked and any malformation raises ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ValueError with a formatted message; evaluates to -1. */
#define BAD(...) (PyErr_Format(PyExc_ValueError, __VA_ARGS__), -1)

/* ---- zigzag varints ---- */

static inline uint64_t zz(int64_t v) { return ((uint64_t)v << 1) ^ (0 - ((uint64_t)v >> 63)); }

static inline Py_ssize_t vsize(int64_t v)
{
    uint64_t u = zz(v);
    Py_ssize_t n = 1;
    while (u >= 0x80) { u >>= 7; n++; }
    return n;
}

static inline char *vput(char *p, int64_t v)
{
    uint64_t u = zz(v);
    while (u >= 0x80) { *p++ = (char)(u | 0x80); u >>= 7; }
    *p++ = (char)u;
    return p;
}

/* Reads a varint of at most maxb bytes (5: int32, 10: int64) from [*pp, end).
 * Returns 0 and advances *pp, or -1 with ValueError naming record i and the field. */
static int vget(const unsigned char **pp, const unsigned char *end, int maxb, int64_t *out,
                Py_ssize_t i, const char *field)
{
    const unsigned char *p = *pp;
    uint64_t u = 0;
    for (int k = 0; k < maxb; k++) {
        if (p >= end) return BAD("record %zd: %s: truncated varint", i, field);
        unsigned int b = *p++;
        u |= (uint64_t)(b & 0x7f) << (7 * k);
        if (!(b & 0x80)) {
            if ((maxb == 5 && u > 0xffffffffu) || (k == 9 && b > 1))
                return BAD("record %zd: %s: varint out of range", i, field);
            *pp = p;
            *out = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
            return 0;
        }
    }
    return BAD("record %zd: %s: varint longer than %d bytes", i, field, maxb);
}

/* ---- encoding ---- */

/* A key, value or header part: n == -1 for None. Bytes are borrowed without a buffer. */
typedef struct { const char *p; Py_ssize_t n; int held; Py_buffer view; } data_t;

static void data_release(data_t *d)
{
    if (d->held) { PyBuffer_Release(&d->view); d->held = 0; }
}

static int data_get(PyObject *o, data_t *d, const char *what)
{
    d->held = 0;
    if (o == Py_None) { d->p = NULL; d->n = -1; return 0; }
    if (PyBytes_CheckExact(o)) { d->p = PyBytes_AS_STRING(o); d->n = PyBytes_GET_SIZE(o); }
    else {
        if (PyUnicode_Check(o) || !PyObject_CheckBuffer(o)) {
            PyErr_Format(PyExc_TypeError, "%s must be a bytes-like object or None, not %.100s",
                         what, Py_TYPE(o)->tp_name);
            return -1;
        }
        if (PyObject_GetBuffer(o, &d->view, PyBUF_SIMPLE) < 0) {
            if (PyErr_ExceptionMatches(PyExc_BufferError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous buffer", what);
            }
            return -1;
        }
        d->held = 1; d->p = d->view.buf; d->n = d->view.len;
    }
    if (d->n > INT32_MAX) {
        data_release(d);
        return BAD("%s is too large (%zd bytes)", what, d->n);
    }
    return 0;
}

static inline char *dput(char *p, const data_t *d)
{
    p = vput(p, d->n);
    if (d->n > 0) { memcpy(p, d->p, (size_t)d->n); p += d->n; }
    return p;
}

static inline Py_ssize_t dsize(const data_t *d) { return vsize(d->n) + (d->n > 0 ? d->n : 0); }

/* Only Python code run mid-encoding (__index__, __buffer__) can make the passes disagree. */
static int changed(void)
{
    PyErr_SetString(PyExc_RuntimeError, "rows changed while they were being encoded");
    return -1;
}

/* Measures (out == NULL) or writes into [out, end) a tuple of (name, value) headers.
 * validate: check that bytes names are UTF-8. Returns the size, or -1 on error. */
static Py_ssize_t put_headers(PyObject *hs, char *out, char *end, int validate)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hs); i++) {
        PyObject *h = PyTuple_GET_ITEM(hs, i);
        if (!(PyTuple_Check(h) || PyList_Check(h)) || PySequence_Fast_GET_SIZE(h) != 2) {
            PyErr_SetString(PyExc_TypeError, "each header must be a (name, value) tuple or list");
            return -1;
        }
        PyObject *name = Py_NewRef(PySequence_Fast_GET_ITEM(h, 0));
        PyObject *val = Py_NewRef(PySequence_Fast_GET_ITEM(h, 1));
        data_t n, v;
        n.held = v.held = 0;
        Py_ssize_t sz = -1;
        if (PyUnicode_Check(name)) {
            if (!(n.p = PyUnicode_AsUTF8AndSize(name, &n.n))) goto done;
        } else if (name == Py_None) {
            PyErr_SetString(PyExc_TypeError, "header name must be str or bytes, not None");
            goto done;
        } else if (data_get(name, &n, "header name") < 0) {
            goto done;
        } else if (validate) {
            PyObject *s = PyUnicode_DecodeUTF8(n.p, n.n, "strict");
            if (!s) goto done;
            Py_DECREF(s);
        }
        if (data_get(val, &v, "header value") < 0) goto done;
        sz = dsize(&n) + dsize(&v);
        if (out) {
            if (sz > end - out) { sz = changed(); goto done; }
            out = dput(dput(out, &n), &v);
        }
    done:
        data_release(&n); data_release(&v);
        Py_DECREF(name); Py_DECREF(val);
        if (sz < 0) return -1;
        total += sz;
    }
    return total;
}

/* One record to encode; items holds references to the row's fields while it is in use. */
typedef struct {
    int64_t od, td;
    data_t key, value;
    PyObject *headers;  /* tuple, or NULL for none */
    PyObject *items[5];
} rec_t;

static int get_int(PyObject *o, int64_t lo, int64_t hi, const char *what, int64_t *out)
{
    int overflow;
    long long v;
    if (PyLong_CheckExact(o)) v = PyLong_AsLongLongAndOverflow(o, &overflow);
    else {
        PyObject *i = PyNumber_Index(o);
        if (!i) return -1;
        v = PyLong_AsLongLongAndOverflow(i, &overflow);
        Py_DECREF(i);
    }
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_OverflowError, "%s out of range", what);
        return -1;
    }
    *out = v;
    return 0;
}

static void rec_close(rec_t *r)
{
    data_release(&r->key); data_release(&r->value);
    Py_CLEAR(r->headers);
    if (r->items[0])
        for (int k = 0; k < 5; k++) Py_CLEAR(r->items[k]);
}

/* (No memset of the whole rec_t: clearing its two Py_buffers costs more than the rest.) */
static int rec_open(PyObject *row, rec_t *r)
{
    r->key.held = r->value.held = 0;
    r->headers = NULL;
    if (!(PyTuple_Check(row) || PyList_Check(row)) || PySequence_Fast_GET_SIZE(row) != 5) {
        PyErr_SetString(PyExc_TypeError, "each row must be a tuple or list "
                        "(offset_delta, timestamp_delta, key, value, headers)");
        return -1;
    }
    for (int k = 0; k < 5; k++)
        r->items[k] = Py_NewRef(PySequence_Fast_GET_ITEM(row, k));
    if (get_int(r->items[0], INT32_MIN, INT32_MAX, "offset_delta", &r->od) < 0
        || get_int(r->items[1], INT64_MIN, INT64_MAX, "timestamp_delta", &r->td) < 0
        || data_get(r->items[2], &r->key, "key") < 0
        || data_get(r->items[3], &r->value, "value") < 0)
        goto fail;
    if (r->items[4] != Py_None) {
        if (PyUnicode_Check(r->items[4]) || PyBytes_Check(r->items[4])) {
            PyErr_SetString(PyExc_TypeError,
                            "headers must be a sequence of (name, value) pairs or None");
            goto fail;
        }
        if (!(r->headers = PySequence_Tuple(r->items[4]))) goto fail;
    }
    return 0;
fail:
    rec_close(r);
    return -1;
}

/* Measures (out == NULL) or writes into [out, end) one whole record; returns its size or -1. */
static Py_ssize_t rec_put(rec_t *r, char *out, char *end, int validate)
{
    Py_ssize_t hn = r->headers ? PyTuple_GET_SIZE(r->headers) : 0;
    Py_ssize_t hsize = hn ? put_headers(r->headers, NULL, NULL, validate) : 0;
    if (hsize < 0) return -1;
    Py_ssize_t body = 1 + vsize(r->td) + vsize(r->od) + dsize(&r->key) + dsize(&r->value)
                      + vsize(hn) + hsize;
    if (body > INT32_MAX) return BAD("record too large (%zd bytes)", body);
    Py_ssize_t total = vsize(body) + body;
    if (!out) return total;
    if (total > end - out) return changed();
    char *p = vput(out, body);
    *p++ = 0;  /* attributes */
    p = vput(vput(p, r->td), r->od);
    p = vput(dput(dput(p, &r->key), &r->value), hn);
    if (hn) {
        Py_ssize_t w = put_headers(r->headers, p, out + total, 0);
        if (w < 0) return -1;
        p += w;
    }
    if (p != out + total) return changed();
    return total;
}

/* Runs both passes over n records that open(i) prepares: sizes, then one bytes object. */
typedef int (*open_fn)(PyObject *a, PyObject *b, Py_ssize_t i, rec_t *r);

static PyObject *encode(open_fn open, PyObject *a, PyObject *b, Py_ssize_t n)
{
    Py_ssize_t total = 0;
    rec_t r;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (open(a, b, i, &r) < 0) return NULL;
        Py_ssize_t s = rec_put(&r, NULL, NULL, 1);
        rec_close(&r);
        if (s < 0) return NULL;
        if (s > PY_SSIZE_T_MAX - total) return PyErr_NoMemory();
        total += s;
    }
    PyObject *res = PyBytes_FromStringAndSize(NULL, total);
    if (!res) return NULL;
    char *p = PyBytes_AS_STRING(res), *end = p + total;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (open(a, b, i, &r) < 0) goto fail;
        Py_ssize_t s = rec_put(&r, p, end, 0);
        rec_close(&r);
        if (s < 0) goto fail;
        p += s;
    }
    if (p == end) return res;
    changed();
fail:
    Py_DECREF(res);
    return NULL;
}

static int open_row(PyObject *rows, PyObject *unused, Py_ssize_t i, rec_t *r)
{
    (void)unused;  /* same signature as open_value */
    return rec_open(PyTuple_GET_ITEM(rows, i), r);
}

static int open_value(PyObject *values, PyObject *keys, Py_ssize_t i, rec_t *r)
{
    r->key.held = 0;
    r->headers = r->items[0] = NULL;
    r->od = i, r->td = 0;
    if (data_get(keys ? PyTuple_GET_ITEM(keys, i) : Py_None, &r->key, "key") < 0) return -1;
    if (data_get(PyTuple_GET_ITEM(values, i), &r->value, "value") < 0) {
        data_release(&r->key);
        return -1;
    }
    return 0;
}

static PyObject *encode_rows(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *rows = PySequence_Tuple(arg);
    if (!rows) return NULL;
    PyObject *res = encode(open_row, rows, NULL, PyTuple_GET_SIZE(rows));
    Py_DECREF(rows);
    return res;
}

static PyObject *encode_values(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"values", "keys", NULL};
    PyObject *v = NULL, *k = Py_None, *values, *keys = NULL, *res = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:encode_values", kwlist, &v, &k)) return NULL;
    if (!(values = PySequence_Tuple(v))) return NULL;
    if (k != Py_None && !(keys = PySequence_Tuple(k))) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(values);
    if (keys && PyTuple_GET_SIZE(keys) != n)
        PyErr_Format(PyExc_ValueError, "%zd keys for %zd values", PyTuple_GET_SIZE(keys), n);
    else if (n - 1 > INT32_MAX)
        PyErr_SetString(PyExc_OverflowError, "offset_delta out of range");
    else
        res = encode(open_value, values, keys, n);
done:
    Py_DECREF(values);
    Py_XDECREF(keys);
    return res;
}

/* ---- decoding ---- */

/* Reads a length-prefixed part; *out is a new reference to bytes, str (as_str) or None. */
static int get_part(const unsigned char **pp, const unsigned char *end, Py_ssize_t i,
                    const char *field, int nullable, int as_str, PyObject **out)
{
    int64_t n;
    if (vget(pp, end, 5, &n, i, field) < 0) return -1;
    if (n < -1 || (n == -1 && !nullable))
        return BAD("record %zd: %s: invalid length %lld", i, field, (long long)n);
    if (n > end - *pp)
        return BAD("record %zd: %s: length %lld runs past the end of the record", i, field,
                   (long long)n);
    if (n == -1) { *out = Py_NewRef(Py_None); return 0; }
    const char *p = (const char *)*pp;
    *pp += n;
    if (!as_str) return (*out = PyBytes_FromStringAndSize(p, n)) ? 0 : -1;
    if ((*out = PyUnicode_DecodeUTF8(p, n, "strict"))) return 0;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
    PyErr_Clear();
    return BAD("record %zd: %s is not valid UTF-8", i, field);
}

#define FAIL(...) do { PyErr_Format(PyExc_ValueError, __VA_ARGS__); goto fail; } while (0)

/* Reads a record's header count and headers into *out: None for none, else a tuple
 * (rows) or a list (Records) of (str name, bytes-or-None value) pairs. */
static int get_headers(const unsigned char **pp, const unsigned char *rend, Py_ssize_t i,
                       int as_list, PyObject **out)
{
    int64_t hn;
    PyObject *hs, *o;
    *out = NULL;
    if (vget(pp, rend, 5, &hn, i, "header count") < 0) return -1;
    if (hn < 0 || hn > (rend - *pp) / 2)  /* a header is at least 2 bytes */
        return BAD("record %zd: header count %lld is negative or runs past the end of the "
                   "record", i, (long long)hn);
    if (hn == 0) {  /* no headers: None, not an empty sequence */
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (!(hs = as_list ? PyList_New((Py_ssize_t)hn) : PyTuple_New((Py_ssize_t)hn))) return -1;
    *out = hs;  /* pairs not filled in yet hold NULL, which the deallocator skips */
    for (Py_ssize_t h = 0; h < hn; h++) {
        PyObject *pair = PyTuple_New(2);
        if (!pair) return -1;
        if (as_list) PyList_SET_ITEM(hs, h, pair);
        else PyTuple_SET_ITEM(hs, h, pair);
        if (get_part(pp, rend, i, "header key", 0, 1, &o) < 0) return -1;
        PyTuple_SET_ITEM(pair, 0, o);
        if (get_part(pp, rend, i, "header value", 1, 0, &o) < 0) return -1;
        PyTuple_SET_ITEM(pair, 1, o);
    }
    return 0;
}

static PyObject *decode_rows(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    Py_ssize_t count;
    PyObject *list = NULL, *row, *hs, *o;
    if (!PyArg_ParseTuple(args, "y*n:decode_rows", &view, &count)) return NULL;
    const unsigned char *p = view.buf, *end = p + view.len;
    if (count < 0) FAIL("record count %zd is negative", count);
    if (count > view.len / 7)  /* the smallest record is 7 bytes */
        FAIL("%zd bytes cannot hold %zd records", view.len, count);
    if (!(list = PyList_New(count))) goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t len, td, od;
        if (p == end) FAIL("buffer ends after %zd of %zd records", i, count);
        if (vget(&p, end, 5, &len, i, "length") < 0) goto fail;
        if (len < 0 || len > end - p)
            FAIL("record %zd: length %lld is negative or runs past the end of the buffer", i,
                 (long long)len);
        const unsigned char *start = p, *rend = p + len;
        if (len < 1) FAIL("record %zd: attributes: truncated", i);
        p++;  /* attributes: unused in v2 records */
        if (vget(&p, rend, 10, &td, i, "timestamp delta") < 0
            || vget(&p, rend, 5, &od, i, "offset delta") < 0 || !(row = PyTuple_New(5)))
            goto fail;
        PyList_SET_ITEM(list, i, row);
        if (!(o = PyLong_FromLongLong(od))) goto fail;
        PyTuple_SET_ITEM(row, 0, o);
        if (!(o = PyLong_FromLongLong(td))) goto fail;
        PyTuple_SET_ITEM(row, 1, o);
        if (get_part(&p, rend, i, "key", 1, 0, &o) < 0) goto fail;
        PyTuple_SET_ITEM(row, 2, o);
        if (get_part(&p, rend, i, "value", 1, 0, &o) < 0) goto fail;
        PyTuple_SET_ITEM(row, 3, o);
        int r = get_headers(&p, rend, i, 0, &hs);
        if (hs) PyTuple_SET_ITEM(row, 4, hs);
        if (r < 0) goto fail;
        if (p != rend)
            FAIL("record %zd: length %lld but its fields use %zd bytes", i, (long long)len,
                 (Py_ssize_t)(p - start));
    }
    if (p != end) FAIL("%zd trailing bytes after %zd records", (Py_ssize_t)(end - p), count);
    PyBuffer_Release(&view);
    return list;
fail:  /* rows and tuples not filled in yet hold NULL, which their deallocators skip */
    Py_XDECREF(list);
    PyBuffer_Release(&view);
    return NULL;
}


/* ---- whole batches: CRC-32C, header checks, walking a buffer of batches ---- */

/* Header layout (big-endian): base_offset i64 @0, batch_length i32 @8, leader_epoch i32 @12,
 * magic i8 @16, crc u32 @17, attributes i16 @21, last_offset_delta i32 @23, first_timestamp
 * i64 @27, max_timestamp i64 @35, producer_id i64 @43, producer_epoch i16 @51, base_sequence
 * i32 @53, record_count i32 @57; records from @61. The CRC covers @21 to the end. */
#define HDR 61
#define OVERHEAD 12
#define MAX_BATCH (1 << 30)
#define ATTR_LOG_APPEND_TIME 0x08

static uint32_t crc_tab[8][256];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC_HW 1
static int crc_hw_ok;
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p,
                                                          size_t n)
{
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
    }
    c = (uint32_t)c64;
    while (n--) c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
#ifdef CRC_HW
    __builtin_cpu_init();
    crc_hw_ok = __builtin_cpu_supports("sse4.2");
#endif
}

/* CRC-32C (Castagnoli) of [p, p + n): the SSE4.2 instruction where the CPU has it,
 * slicing-by-8 tables otherwise. */
static uint32_t crc32c(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
#ifdef CRC_HW
    if (crc_hw_ok) return crc_hw(c, p, n) ^ 0xFFFFFFFFu;
#endif
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16
                           | (uint32_t)p[3] << 24);
        c = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^ crc_tab[5][(lo >> 16) & 0xff]
            ^ crc_tab[4][lo >> 24] ^ crc_tab[3][p[4]] ^ crc_tab[2][p[5]] ^ crc_tab[1][p[6]]
            ^ crc_tab[0][p[7]];
    }
    while (n--) c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xff];
    return c ^ 0xFFFFFFFFu;
}

static inline uint64_t be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}
static inline uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint16_t be16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }

typedef struct {
    int64_t base_offset, first_ts, max_ts, producer_id;
    int32_t batch_length, leader_epoch, last_offset_delta, base_sequence, record_count;
    uint32_t crc;
    int16_t attributes, producer_epoch;
    int magic;
} hdr_t;

static void read_hdr(const unsigned char *p, hdr_t *h)
{
    h->base_offset = (int64_t)be64(p);
    h->batch_length = (int32_t)be32(p + 8);
    h->leader_epoch = (int32_t)be32(p + 12);
    h->magic = (signed char)p[16];
    h->crc = be32(p + 17);
    h->attributes = (int16_t)be16(p + 21);
    h->last_offset_delta = (int32_t)be32(p + 23);
    h->first_ts = (int64_t)be64(p + 27);
    h->max_ts = (int64_t)be64(p + 35);
    h->producer_id = (int64_t)be64(p + 43);
    h->producer_epoch = (int16_t)be16(p + 51);
    h->base_sequence = (int32_t)be32(p + 53);
    h->record_count = (int32_t)be32(p + 57);
}

/* The offset after a batch, base_offset + last_offset_delta + 1, in *out. Both come from
 * untrusted bytes: returns 0, or 1 (-1) when the sum is above (below) int64 and *out
 * is not set; batch_scan.py's Python versions make the same test. */
static int next_offset(int64_t base, int32_t last_delta, int64_t *out)
{
    int64_t step = (int64_t)last_delta + 1;
    if (__builtin_add_overflow(base, step, out)) return step > 0 ? 1 : -1;
    return 0;
}

/* batch.validate() in C, with the same messages: checks the batch at p (avail bytes
 * left) and fills *h. Returns 0, or -1 with the reason in msg. */
static int check_batch(const unsigned char *p, Py_ssize_t avail, int contiguous, hdr_t *h,
                       char *msg, size_t cap)
{
    if (avail < HDR) {
        snprintf(msg, cap, "truncated batch header: %zd of %d bytes", avail, HDR);
        return -1;
    }
    read_hdr(p, h);
    int64_t size = (int64_t)h->batch_length + OVERHEAD;
    if (h->batch_length < HDR - OVERHEAD || size > MAX_BATCH) {
        snprintf(msg, cap, "invalid batch length %d", h->batch_length);
        return -1;
    }
    if (size > avail) {
        snprintf(msg, cap, "truncated batch: %zd of %lld bytes", avail, (long long)size);
        return -1;
    }
    if (h->magic != 2) {
        snprintf(msg, cap, "unsupported batch format version %d", h->magic);
        return -1;
    }
    if (h->record_count <= 0) {
        snprintf(msg, cap, "invalid record count %d", h->record_count);
        return -1;
    }
    if (h->last_offset_delta < h->record_count - 1
        || (contiguous && h->last_offset_delta != h->record_count - 1)) {
        snprintf(msg, cap, "last offset delta %d does not fit %d records", h->last_offset_delta,
                 h->record_count);
        return -1;
    }
    if ((h->attributes & 0x07) > 4) {
        snprintf(msg, cap, "unknown compression codec %d", h->attributes & 0x07);
        return -1;
    }
    if (crc32c(p + 21, (size_t)(size - 21)) != h->crc) {
        snprintf(msg, cap, "checksum mismatch (CRC-32C)");
        return -1;
    }
    return 0;
}

static PyObject *hdr_tuple(Py_ssize_t pos, const hdr_t *h)
{
    return Py_BuildValue("(nLiiiIhiLLLhii)", pos, (long long)h->base_offset, h->batch_length,
                         h->leader_epoch, h->magic, h->crc, h->attributes, h->last_offset_delta,
                         (long long)h->first_ts, (long long)h->max_ts,
                         (long long)h->producer_id, h->producer_epoch, h->base_sequence,
                         h->record_count);
}

static PyObject *scan_batches(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    Py_ssize_t pos, end, origin = 0;
    long long expect;
    int epoch, allow_gaps, contiguous;
    char msg[160] = "";
    Py_ssize_t need = 0;
    if (!PyArg_ParseTuple(args, "y*nnLipp|n:scan_batches", &view, &pos, &end, &expect, &epoch,
                          &allow_gaps, &contiguous, &origin))
        return NULL;
    if (end < 0 || end > view.len) end = view.len;
    if (pos < 0 || pos > end) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "position %zd outside the buffer", pos);
    }
    const unsigned char *buf = view.buf;
    PyObject *list = PyList_New(0);
    if (!list) goto fail;
    while (pos < end) {
        Py_ssize_t rem = end - pos;
        int64_t size = rem >= OVERHEAD ? (int64_t)(int32_t)be32(buf + pos + 8) + OVERHEAD : HDR;
        int64_t want = size > HDR ? size : HDR;
        hdr_t h;
        if (check_batch(buf + pos, rem, contiguous, &h, msg, sizeof msg) < 0) {
            if (want > rem && size <= MAX_BATCH) need = (Py_ssize_t)want;  /* may be a refill */
            break;
        }
        int64_t nxt;
        if (next_offset(h.base_offset, h.last_offset_delta, &nxt)) {
            snprintf(msg, sizeof msg, "offsets overflow: base offset %lld, last offset delta %d",
                     (long long)h.base_offset, h.last_offset_delta);
            break;
        }
        if (expect >= 0 && (allow_gaps ? h.base_offset < expect : h.base_offset != expect)) {
            snprintf(msg, sizeof msg, "batch base offset %lld does not follow %lld",
                     (long long)h.base_offset, expect);
            break;
        }
        if (h.leader_epoch < epoch) {
            snprintf(msg, sizeof msg, "leader epoch %d goes back from %d", h.leader_epoch, epoch);
            break;
        }
        PyObject *t = hdr_tuple(origin + pos, &h);
        if (!t || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            goto fail;
        }
        Py_DECREF(t);
        expect = nxt;
        epoch = h.leader_epoch;
        pos += (Py_ssize_t)size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nnns)", list, pos, need, msg);
fail:
    Py_XDECREF(list);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *py_crc32c(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    int hardware = 1;
    if (!PyArg_ParseTuple(args, "y*|p:crc32c", &view, &hardware)) return NULL;
    uint32_t c;
#ifdef CRC_HW
    int saved = crc_hw_ok;
    crc_hw_ok = saved && hardware;
    c = crc32c(view.buf, (size_t)view.len);
    crc_hw_ok = saved;
#else
    c = crc32c(view.buf, (size_t)view.len);
#endif
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *batches_end(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    Py_ssize_t pos;
    long long nxt = -1;
    if (!PyArg_ParseTuple(args, "y*n:batches_end", &view, &pos)) return NULL;
    const unsigned char *buf = view.buf;
    while (pos >= 0 && view.len - pos >= HDR) {
        int32_t length = (int32_t)be32(buf + pos + 8);
        if (length < HDR - OVERHEAD || (int64_t)length + OVERHEAD > view.len - pos) break;
        int64_t n;
        if (next_offset((int64_t)be64(buf + pos), (int32_t)be32(buf + pos + 23), &n)) break;
        if (n > nxt) nxt = n;
        pos += (Py_ssize_t)length + OVERHEAD;
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(nxt);
}

/* Decodes the records of one checked, uncompressed batch into Record tuples appended to
 * out (those at or after *position, at most max - len(out)). Returns 1 if the batch was
 * used up, 0 if out filled first (*position: the first record not taken), -1 on error. */
static int take_batch(const unsigned char *p, const hdr_t *h, PyObject *out, Py_ssize_t max,
                      long long *position, PyObject *topic, PyObject *partition,
                      PyTypeObject *rtype)
{
    const unsigned char *end = p + h->batch_length + OVERHEAD;
    p += HDR;
    for (Py_ssize_t i = 0; i < h->record_count; i++) {
        int64_t len, td, od;
        PyObject *key = NULL, *value = NULL, *hs = NULL;
        if (p == end) return BAD("buffer ends after %zd of %d records", i, h->record_count);
        if (vget(&p, end, 5, &len, i, "length") < 0) return -1;
        if (len < 1 || len > end - p)
            return BAD("record %zd: length %lld is negative or runs past the end of the buffer",
                       i, (long long)len);
        const unsigned char *rend = p + len;
        p++;
        if (vget(&p, rend, 10, &td, i, "timestamp delta") < 0
            || vget(&p, rend, 5, &od, i, "offset delta") < 0)
            return -1;
        int64_t offset, ts;
        if (__builtin_add_overflow(h->base_offset, od, &offset))
            return BAD("record %zd: offset delta %lld overflows the base offset", i,
                       (long long)od);
        if (offset < *position) {  /* before the fetch position: skipped, not built */
            p = rend;
            continue;
        }
        if (PyList_GET_SIZE(out) >= max) {
            *position = offset;
            return 0;
        }
        if (get_part(&p, rend, i, "key", 1, 0, &key) < 0) return -1;
        if (get_part(&p, rend, i, "value", 1, 0, &value) < 0) goto bad;
        if (get_headers(&p, rend, i, 1, &hs) < 0) goto bad;
        if (p != rend) {
            (void)BAD("record %zd: length %lld but its fields use %zd bytes", i, (long long)len,
                      (Py_ssize_t)(p - (rend - len)));
            goto bad;
        }
        if (h->attributes & ATTR_LOG_APPEND_TIME) {
            ts = h->max_ts;
        } else if (__builtin_add_overflow(h->first_ts, td, &ts)) {
            (void)BAD("record %zd: timestamp delta %lld overflows the first timestamp", i,
                      (long long)td);
            goto bad;
        }
        PyObject *rec = rtype->tp_alloc(rtype, 7);
        PyObject *ooff = PyLong_FromLongLong(offset), *ots = PyLong_FromLongLong(ts);
        if (!rec || !ooff || !ots) {
            Py_XDECREF(rec);
            Py_XDECREF(ooff);
            Py_XDECREF(ots);
            goto bad;
        }
        PyTuple_SET_ITEM(rec, 0, Py_NewRef(topic));
        PyTuple_SET_ITEM(rec, 1, Py_NewRef(partition));
        PyTuple_SET_ITEM(rec, 2, ooff);
        PyTuple_SET_ITEM(rec, 3, ots);
        PyTuple_SET_ITEM(rec, 4, key);
        PyTuple_SET_ITEM(rec, 5, value);
        PyTuple_SET_ITEM(rec, 6, hs);
        /* A record without headers holds only str, int, bytes and None and (no instance
         * dict) can never be in a cycle: untracked, the cyclic GC never scans it. CPython
         * untracks such plain tuples itself, but never a subclass such as Record, so a
         * poll of 200,000 records cost a scan of each at every full collection. */
        if (hs == Py_None && rtype->tp_dictoffset == 0) PyObject_GC_UnTrack(rec);
        int r = PyList_Append(out, rec);
        Py_DECREF(rec);
        if (r < 0) return -1;
        continue;
    bad:
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(hs);
        return -1;
    }
    if (p != end)
        return BAD("%zd trailing bytes after %d records", (Py_ssize_t)(end - p), h->record_count);
    *position = h->base_offset + h->last_offset_delta + 1;  /* take_records checked it */
    return 1;
}

static PyObject *take_records(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    Py_ssize_t pos, max;
    long long position;
    PyObject *topic, *partition, *rtype;
    char msg[300] = "";
    if (!PyArg_ParseTuple(args, "y*nLnOOO!:take_records", &view, &pos, &position, &max, &topic,
                          &partition, &PyType_Type, &rtype))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)rtype, &PyTuple_Type)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_TypeError, "the record type must be a tuple subclass");
    }
    const unsigned char *buf = view.buf;
    PyObject *out = PyList_New(0);
    if (!out) goto fail;
    while (PyList_GET_SIZE(out) < max && pos >= 0 && view.len - pos >= HDR) {
        int32_t length = (int32_t)be32(buf + pos + 8);
        if (length < HDR - OVERHEAD || (int64_t)length + OVERHEAD > MAX_BATCH) {
            snprintf(msg, sizeof msg, "invalid batch length %d", length);
            break;
        }
        Py_ssize_t size = (Py_ssize_t)length + OVERHEAD;
        if (size > view.len - pos) break;  /* a trailing partial batch: the next fetch has it */
        int64_t nxt;
        int over = next_offset((int64_t)be64(buf + pos), (int32_t)be32(buf + pos + 23), &nxt);
        if (over < 0 || (!over && nxt <= position)) {  /* wholly before: skipped unread */
            pos += size;
            continue;
        }
        hdr_t h;
        if (check_batch(buf + pos, view.len - pos, 0, &h, msg, sizeof msg) < 0) break;
        if (over) {
            snprintf(msg, sizeof msg, "offsets overflow: base offset %lld, last offset delta %d",
                     (long long)h.base_offset, h.last_offset_delta);
            break;
        }
        if (h.attributes & 0x07) {
            snprintf(msg, sizeof msg, "compressed");
            break;
        }
        Py_ssize_t before = PyList_GET_SIZE(out);
        int r = take_batch(buf + pos, &h, out, max, &position, topic, partition,
                           (PyTypeObject *)rtype);
        if (r < 0) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError)) goto fail;
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyObject *s = value ? PyObject_Str(value) : NULL;
            const char *text = s ? PyUnicode_AsUTF8(s) : NULL;
            snprintf(msg, sizeof msg, "cannot decode records: %s", text ? text : "?");
            Py_XDECREF(s);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            PyErr_Clear();
            /* nothing from a batch that fails to decode is handed out */
            if (PyList_SetSlice(out, before, PyList_GET_SIZE(out), NULL) < 0) goto fail;
            break;
        }
        if (r == 0) break;  /* out is full; this batch is taken again from position */
        pos += size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NnLs)", out, pos, position, msg);
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

/* ---- new logs: directories and first segment files, without the GIL ---- */

/* make_log_dirs(dirs, files): mkdir each directory (bytes paths, mode 0755) unless it
 * exists, then create the empty file files[i] (0644) unless it exists. The loop runs
 * without the GIL: a worker thread making thousands of new logs would otherwise wait
 * for the GIL after every system call while the event loop runs, a few milliseconds
 * each time. Raises OSError (with the path) at the first other failure. */
static PyObject *make_log_dirs(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *dirs, *files;
    if (!PyArg_ParseTuple(args, "O!O!:make_log_dirs", &PyList_Type, &dirs, &PyList_Type, &files))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(dirs);
    if (PyList_GET_SIZE(files) != n)
        return PyErr_Format(PyExc_ValueError, "%zd directories but %zd files", n,
                            PyList_GET_SIZE(files));
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyBytes_Check(PyList_GET_ITEM(dirs, i)) || !PyBytes_Check(PyList_GET_ITEM(files, i)))
            return PyErr_Format(PyExc_TypeError, "path %zd is not bytes", i);
    /* the lists (and so their bytes) stay alive and unchanged: a copy of each is held */
    PyObject *d = PyList_GetSlice(dirs, 0, n), *f = PyList_GetSlice(files, 0, n);
    if (!d || !f) {
        Py_XDECREF(d);
        Py_XDECREF(f);
        return NULL;
    }
    const char *failed = NULL;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *dir = PyBytes_AS_STRING(PyList_GET_ITEM(d, i));
        const char *file = PyBytes_AS_STRING(PyList_GET_ITEM(f, i));
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
            failed = dir, err = errno;
            break;
        }
        int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            close(fd);
        } else if (errno != EEXIST) {
            failed = file, err = errno;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *res = NULL;
    if (failed) {
        errno = err;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, failed);
    } else {
        res = Py_NewRef(Py_None);
    }
    Py_DECREF(d);
    Py_DECREF(f);
    return res;
}

static PyMethodDef methods[] = {
    {"encode_rows", encode_rows, METH_O,
     "encode_rows(rows) -> bytes: rows of (offset_delta, timestamp_delta, key, value, headers)."},
    {"encode_values", (PyCFunction)(void (*)(void))encode_values, METH_VARARGS | METH_KEYWORDS,
     "encode_values(values, keys=None) -> bytes: record i has offset_delta i, timestamp_delta 0."},
    {"decode_rows", decode_rows, METH_VARARGS,
     "decode_rows(buf, count) -> list of (offset_delta, timestamp_delta, key, value, headers)."},
    {"scan_batches", scan_batches, METH_VARARGS,
     "scan_batches(buf, pos, end, expect, epoch, allow_gaps, contiguous, origin=0) -> (headers, "
     "stop, need, reason): checks the batches in buf[pos:end] (see batch_scan)."},
    {"crc32c", py_crc32c, METH_VARARGS,
     "crc32c(buf, hardware=True) -> the CRC-32C the batch checks use (for tests)."},
    {"batches_end", batches_end, METH_VARARGS,
     "batches_end(buf, pos) -> the largest next offset of the whole batches from pos, or -1."},
    {"make_log_dirs", make_log_dirs, METH_VARARGS,
     "make_log_dirs(dirs, files): each directory and its empty first file, without the GIL."},
    {"take_records", take_records, METH_VARARGS,
     "take_records(buf, pos, position, max, topic, partition, record_type) -> (records, pos, "
     "position, stop): checks and decodes uncompressed batches (see batch_scan)."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *m)
{
    (void)m;
    crc_init();
    return 0;
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, exec_module}, {0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recordsv2",
    "Kafka RecordBatch v2 records section codec (see records_codec).", 0, methods, slots,
    NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__recordsv2(void) { return PyModuleDef_Init(&module); }
