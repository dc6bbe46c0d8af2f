// smelt._smelt: the C API (include/smelt.h, include/smelt_compile.h) for Python.
//
// A thin layer: the Python package (python/smelt/__init__.py) holds the
// public classes, their docstrings and type hints, and converts what users
// pass (numpy arrays, DLPack tensors, dicts of dims) into what is bound here.
// This file owns the C objects, releases the GIL around everything that
// compiles or runs, and turns a smelt_status into a Python exception of the
// class registered for its code (smelt.Error and its subclasses, given by
// the package at import through _set_error_classes).
//
// Tensors arrive as nb::ndarray, which takes numpy arrays (buffer protocol)
// and any object with __dlpack__ or a DLPack capsule, on the CPU or on a
// CUDA device, without copying.  Host memory is bound as it is; CUDA memory
// is bound as a device pointer (smelt_session_bind_input takes either).
// CUDA tensors come as the DLPack capsules the package asked their producer
// for with the session's stream (__dlpack__(stream=Session.cuda_stream)),
// so the producer has already made that stream wait for its work; outputs
// smelt allocates come back as DLPack arrays owning a smelt_cuda_buffer.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/optional.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "smelt.h"
#include "smelt_compile.h"

// The compile driver's in-memory compile (compiler/driver.h, part of
// libsmelt, linked statically here).  Declared here rather than included:
// driver.h pulls in the compiler's internal C headers.
extern "C" smelt_status sc_compile_model_to_memory(const char *model_path, const smelt_compile_options *options,
                                                   void **out_buf, size_t *out_len);

namespace nb = nanobind;

namespace {

// A failed smelt_status, carried out of a GIL-released region.
struct SmeltError {
  int code;
  std::string message;
};

// The exception classes, indexed by smelt_status code ([0] is smelt.Error).
// Strong references kept for the life of the process (plain pointers: a
// static nb::object would be released after the interpreter is gone).
PyObject *g_error_classes[6];

[[noreturn]] void throw_status(smelt_status st) {
  SmeltError e{smelt_status_code(st), smelt_status_message(st) ? smelt_status_message(st) : "unknown error"};
  smelt_status_free(st);
  throw e;
}

inline void check(smelt_status st) {
  if (st) throw_status(st);
}

[[noreturn]] void invalid(const std::string &msg) { throw SmeltError{SMELT_INVALID_INPUT, msg}; }

const char *dtype_name(int dt) {
  switch (dt) {
    case SMELT_F32: return "f32";
    case SMELT_F16: return "f16";
    case SMELT_BF16: return "bf16";
    case SMELT_F64: return "f64";
    case SMELT_I64: return "i64";
    case SMELT_I32: return "i32";
    case SMELT_I8: return "i8";
    case SMELT_U8: return "u8";
    case SMELT_BOOL: return "bool";
  }
  return "?";
}

// smelt's dtype of a DLPack dtype; 0 where smelt has none.
int dtype_of(nb::dlpack::dtype d) {
  if (d.lanes != 1) return 0;
  switch ((nb::dlpack::dtype_code)d.code) {
    case nb::dlpack::dtype_code::Float:
      return d.bits == 32 ? SMELT_F32 : d.bits == 16 ? SMELT_F16 : d.bits == 64 ? SMELT_F64 : 0;
    case nb::dlpack::dtype_code::Bfloat: return d.bits == 16 ? SMELT_BF16 : 0;
    case nb::dlpack::dtype_code::Int:
      return d.bits == 64 ? SMELT_I64 : d.bits == 32 ? SMELT_I32 : d.bits == 8 ? SMELT_I8 : 0;
    case nb::dlpack::dtype_code::UInt: return d.bits == 8 ? SMELT_U8 : 0;
    case nb::dlpack::dtype_code::Bool: return d.bits == 8 ? SMELT_BOOL : 0;
    default: return 0;
  }
}

std::string dlpack_dtype_str(nb::dlpack::dtype d) {
  static const char *codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string s = d.code < 7 ? codes[d.code] : "code" + std::to_string(d.code);
  s += std::to_string(d.bits);
  if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
  return s;
}

// (name, dtype, shape) of a tensor; shape entries -1 where specialisations differ.
using Info = std::tuple<std::string, std::string, std::vector<int64_t>>;

Info info_of(const smelt_tensor_info &ti) {
  std::vector<int64_t> dims(ti.dims, ti.dims + (ti.rank < 8 ? ti.rank : 8));
  return Info(ti.name ? ti.name : "", dtype_name(ti.dtype), dims);
}

using RoArray = nb::ndarray<nb::ro>;  // inputs, states written: read-only arrays are fine
using RwArray = nb::ndarray<>;        // outputs, states read

template <typename A>
bool c_contiguous(const A &a) {
  int64_t want = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != want) return false;
    want *= (int64_t)a.shape(i);
  }
  return true;
}

// Calls cuCtxSynchronize on the calling thread's current context (libcuda
// found with dlopen, as the runtime does), so that work a producer queued
// on its own streams is done before smelt's stream reads the memory: only
// for a CUDA tensor whose producer would not take the session's stream
// (its __dlpack__ has no `stream` argument; the package says so).
// No libcuda or no current context: nothing to wait for.
void sync_current_cuda_context() {
  static int (*ctx_sync)(void) = nullptr;
  static bool tried = false;
  if (!tried) {
    tried = true;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) ctx_sync = (int (*)(void))dlsym(h, "cuCtxSynchronize");
  }
  if (ctx_sync) ctx_sync();
}

// ---- bundles ----

struct Bundle {
  smelt_bundle *b = nullptr;
  std::string path;  // "" for a bundle compiled in memory
  nb::object data;   // the bundle's bytes (bytes), when compiled here (for save()); else None

  ~Bundle() { smelt_bundle_close(b); }

  int num_specialisations() const { return smelt_bundle_num_specialisations(b); }

  // The tensors of specialisation spec (which: 0 inputs, 1 outputs, 2
  // states), from the bundle alone (no session, so no device needed).
  std::vector<Info> infos(int spec, int which) const {
    int n = which == 0 ? smelt_bundle_num_inputs(b) : which == 1 ? smelt_bundle_num_outputs(b)
                                                                 : smelt_bundle_num_states(b);
    std::vector<Info> r;
    for (int i = 0; i < n; i++) {
      smelt_tensor_info ti;
      if (which == 0) check(smelt_bundle_input_info(b, spec, i, &ti));
      else if (which == 1) check(smelt_bundle_output_info(b, spec, i, &ti));
      else check(smelt_bundle_state_info(b, spec, i, &ti));
      r.push_back(info_of(ti));
    }
    return r;
  }
  std::string specialisation_dims(int i) const {
    const char *d = smelt_bundle_specialisation_dims(b, i);
    if (!d) throw nb::index_error("specialisation out of range");
    return d;
  }
};

Bundle *bundle_open(const std::string &path) {
  smelt_bundle *b = nullptr;
  smelt_status st;
  {
    nb::gil_scoped_release nogil;
    st = smelt_bundle_open(path.c_str(), &b);
  }
  check(st);
  Bundle *r = new Bundle();
  r->b = b;
  r->path = path;
  return r;
}

Bundle *compile_model(const std::string &model_path, std::optional<std::string> targets,
                      std::optional<std::string> dims, std::optional<std::string> dtype,
                      std::optional<std::string> passes, std::optional<std::string> cpu, int64_t onchip_bytes,
                      int threads, bool allow_tf32, bool external_weights, bool no_cache, int tp) {
  smelt_compile_options o;
  std::memset(&o, 0, sizeof o);
  o.targets = targets ? targets->c_str() : nullptr;
  o.dims = dims ? dims->c_str() : nullptr;
  o.dtype = dtype ? dtype->c_str() : nullptr;
  o.passes = passes ? passes->c_str() : nullptr;
  o.cpu = cpu ? cpu->c_str() : nullptr;
  o.onchip_bytes = onchip_bytes;
  o.threads = threads;
  o.allow_tf32 = allow_tf32;
  o.external_weights = external_weights;
  o.no_cache = no_cache;
  o.tp = tp;
  void *buf = nullptr;
  size_t len = 0;
  smelt_bundle *b = nullptr;
  smelt_status st;
  {
    nb::gil_scoped_release nogil;
    st = sc_compile_model_to_memory(model_path.c_str(), &o, &buf, &len);
    if (!st) st = smelt_bundle_open_memory(buf, len, &b);
  }
  if (st) {
    free(buf);
    throw_status(st);
  }
  Bundle *r = new Bundle();
  r->b = b;
  r->data = nb::bytes((const char *)buf, len);
  free(buf);
  return r;
}

// ---- sessions ----

struct Session {
  smelt_session *s = nullptr;
  bool cuda = false;
  int ordinal = 0;  // of a CUDA session's device
  std::mutex lock;  // a session is used by one thread at a time (smelt.h); the GIL is released while it runs

  ~Session() { smelt_session_destroy(s); }

  std::vector<Info> infos(int which) const {  // 0 inputs, 1 outputs, 2 states
    int n = which == 0 ? smelt_session_num_inputs(s) : which == 1 ? smelt_session_num_outputs(s)
                                                                  : smelt_session_num_states(s);
    std::vector<Info> r;
    for (int i = 0; i < n; i++) {
      smelt_tensor_info ti;
      if (which == 0) smelt_session_input_info(s, i, &ti);
      else if (which == 1) smelt_session_output_info(s, i, &ti);
      else smelt_session_state_info(s, i, &ti);
      r.push_back(info_of(ti));
    }
    return r;
  }

  bool find(int which, const std::string &name, smelt_tensor_info *out) const {
    int n = which == 0 ? smelt_session_num_inputs(s) : which == 1 ? smelt_session_num_outputs(s)
                                                                  : smelt_session_num_states(s);
    for (int i = 0; i < n; i++) {
      if (which == 0) smelt_session_input_info(s, i, out);
      else if (which == 1) smelt_session_output_info(s, i, out);
      else smelt_session_state_info(s, i, out);
      if (out->name && name == out->name) return true;
    }
    return false;
  }

  std::string names(int which) const {
    std::string r;
    for (auto &i : infos(which)) r += (r.empty() ? "" : ", ") + std::get<0>(i);
    return r.empty() ? "none" : r;
  }

  // Checks an array against tensor `name` (kind `what`) and returns its
  // pointer and size: dtype, contiguity and device here; shape and size
  // are the C API's to check (it knows the specialisations).
  template <typename A>
  const void *tensor_ptr(const char *what, const std::string &name, const smelt_tensor_info &ti, const A &a,
                         size_t *out_bytes) {
    int dt = dtype_of(a.dtype());
    // bf16 has no numpy dtype: its raw bits as uint16 are taken too
    if (ti.dtype == SMELT_BF16 && a.dtype() == nb::dtype<uint16_t>()) dt = SMELT_BF16;
    if (dt != (int)ti.dtype)
      invalid(std::string(what) + " '" + name + "' is " + dtype_name(ti.dtype) + "; the array given has dtype " +
              (dt ? dtype_name(dt) : dlpack_dtype_str(a.dtype())));
    if (!c_contiguous(a))
      invalid(std::string(what) + " '" + name + "': the array is not C-contiguous (smelt binds memory as it is)");
    int dev = a.device_type();
    if (dev == nb::device::cuda::value) {
      if (!cuda)
        invalid(std::string(what) + " '" + name + "' is in CUDA memory but the session runs on the CPU");
      if (a.device_id() != ordinal)
        invalid(std::string(what) + " '" + name + "' is on cuda:" + std::to_string(a.device_id()) +
                " but the session runs on cuda:" + std::to_string(ordinal));
    } else if (dev != nb::device::cpu::value && dev != nb::device::cuda_host::value &&
               dev != nb::device::cuda_managed::value) {
      throw SmeltError{SMELT_UNSUPPORTED, std::string(what) + " '" + name + "': memory of DLPack device type " +
                                              std::to_string(dev) + " (smelt takes CPU and CUDA memory)"};
    }
    *out_bytes = a.nbytes();
    return a.data();
  }

  // Binds every input and output, then runs (unless !execute: then only
  // the bindings' checks); the GIL is released for the run.  sync: first
  // wait for the current CUDA context (a CUDA tensor was taken from a
  // producer that would not order its work before the session's stream).
  void run(const std::vector<std::pair<std::string, RoArray>> &inputs,
           const std::vector<std::pair<std::string, RwArray>> &outputs, bool execute, bool sync) {
    std::lock_guard<std::mutex> guard(lock);
    for (auto &[name, a] : inputs) {
      smelt_tensor_info ti;
      if (!find(0, name, &ti)) invalid("the model has no input '" + name + "' (inputs: " + names(0) + ")");
      size_t bytes;
      const void *p = tensor_ptr("input", name, ti, a, &bytes);
      std::vector<int64_t> dims(a.ndim());
      for (size_t i = 0; i < a.ndim(); i++) dims[i] = (int64_t)a.shape(i);
      check(smelt_session_bind_input_shaped(s, name.c_str(), p, (int)a.ndim(), dims.data(), bytes));
    }
    for (auto &[name, a] : outputs) {
      smelt_tensor_info ti;
      if (!find(1, name, &ti)) invalid("the model has no output '" + name + "' (outputs: " + names(1) + ")");
      size_t bytes;
      void *p = (void *)tensor_ptr("output", name, ti, a, &bytes);
      check(smelt_session_bind_output(s, name.c_str(), p, bytes));
    }
    if (!execute) return;
    smelt_status st;
    {
      nb::gil_scoped_release nogil;
      if (sync && cuda) sync_current_cuda_context();
      st = smelt_session_run(s);
    }
    check(st);
  }

  int specialisation() const { return smelt_session_specialisation(s); }

  // The CUstream the session's runs are queued on, as an integer (what
  // DLPack's __dlpack__(stream=...) takes).
  uintptr_t cuda_stream() const {
    void *st = nullptr;
    check(smelt_session_cuda_stream(s, &st));
    return (uintptr_t)st;
  }

  // A new C-contiguous array of `shape` and smelt dtype `dt` in device
  // memory of the session's GPU, owned by the returned object (a DLPack
  // array: __dlpack__, __dlpack_device__); freed when the last reference to
  // it (or to a tensor made from it by from_dlpack) goes.
  // Returns the array and its device address.
  std::pair<nb::ndarray<nb::array_api, nb::device::cuda>, uintptr_t> alloc_cuda(const std::vector<int64_t> &shape,
                                                                                const std::string &dtype) {
    int dt = 0;
    for (int i = SMELT_F32; i <= SMELT_BOOL && !dt; i++)
      if (dtype == dtype_name(i)) dt = i;
    size_t elem = 0;
    nb::dlpack::dtype d;
    d.lanes = 1;
    switch (dt) {
      case SMELT_F32: d = nb::dtype<float>(), elem = 4; break;
      case SMELT_F64: d = nb::dtype<double>(), elem = 8; break;
      case SMELT_F16: d.code = (uint8_t)nb::dlpack::dtype_code::Float, d.bits = 16, elem = 2; break;
      case SMELT_BF16: d.code = (uint8_t)nb::dlpack::dtype_code::Bfloat, d.bits = 16, elem = 2; break;
      case SMELT_I64: d = nb::dtype<int64_t>(), elem = 8; break;
      case SMELT_I32: d = nb::dtype<int32_t>(), elem = 4; break;
      case SMELT_I8: d = nb::dtype<int8_t>(), elem = 1; break;
      case SMELT_U8: d = nb::dtype<uint8_t>(), elem = 1; break;
      case SMELT_BOOL: d = nb::dtype<bool>(), elem = 1; break;
      default: invalid("alloc_cuda: unknown dtype '" + dtype + "'");
    }
    d.lanes = 1;
    std::vector<size_t> dims;
    size_t bytes = elem;
    for (int64_t x : shape) {
      if (x < 0) invalid("alloc_cuda: negative dim");
      dims.push_back((size_t)x);
      bytes *= (size_t)x;
    }
    smelt_cuda_buffer *buf = nullptr;
    smelt_status st;
    {
      nb::gil_scoped_release nogil;
      st = smelt_session_cuda_alloc(s, bytes, &buf);
    }
    check(st);
    nb::capsule owner(buf, [](void *p) noexcept { smelt_cuda_buffer_free((smelt_cuda_buffer *)p); });
    void *ptr = smelt_cuda_buffer_data(buf);
    return {nb::ndarray<nb::array_api, nb::device::cuda>(ptr, dims.size(), dims.data(), owner, nullptr, d,
                                                         nb::device::cuda::value, ordinal),
            (uintptr_t)ptr};
  }

  void select(int i) {
    std::lock_guard<std::mutex> guard(lock);
    smelt_status st;
    {
      nb::gil_scoped_release nogil;
      st = smelt_session_select(s, i);
    }
    check(st);
  }

  void reset_state() {
    std::lock_guard<std::mutex> guard(lock);
    check(smelt_session_reset_state(s));
  }

  void read_state(const std::string &name, RwArray a) {
    std::lock_guard<std::mutex> guard(lock);
    smelt_tensor_info ti;
    if (!find(2, name, &ti)) invalid("the model has no state '" + name + "' (states: " + names(2) + ")");
    if (a.device_type() != nb::device::cpu::value) invalid("read_state: the destination must be in host memory");
    size_t bytes;
    void *p = (void *)tensor_ptr("state", name, ti, a, &bytes);
    smelt_status st;
    {
      nb::gil_scoped_release nogil;
      st = smelt_session_read_state(s, name.c_str(), p, bytes);
    }
    check(st);
  }

  void write_state(const std::string &name, RoArray a) {
    std::lock_guard<std::mutex> guard(lock);
    smelt_tensor_info ti;
    if (!find(2, name, &ti)) invalid("the model has no state '" + name + "' (states: " + names(2) + ")");
    if (a.device_type() != nb::device::cpu::value) invalid("write_state: the source must be in host memory");
    size_t bytes;
    const void *p = tensor_ptr("state", name, ti, a, &bytes);
    smelt_status st;
    {
      nb::gil_scoped_release nogil;
      st = smelt_session_write_state(s, name.c_str(), p, bytes);
    }
    check(st);
  }
};

Session *session_create(Bundle &b, const std::string &device, int threads) {
  if (threads < 0) invalid("threads must be >= 0 (0: one per core)");
  smelt_session_options o;
  std::memset(&o, 0, sizeof o);
  o.threads = threads;
  o.cuda_compile = smelt_nvrtc_compile;  // for a GPU the bundle has no cubin for
  smelt_session *s = nullptr;
  smelt_status st;
  {
    nb::gil_scoped_release nogil;
    st = smelt_session_create(b.b, device.c_str(), &o, &s);
  }
  check(st);
  Session *r = new Session();
  r->s = s;
  r->cuda = device.rfind("cuda", 0) == 0;
  r->ordinal = device.rfind("cuda:", 0) == 0 ? std::atoi(device.c_str() + 5) : 0;
  return r;
}

}  // namespace

NB_MODULE(_smelt, m) {
  m.doc() = "smelt's C API for the smelt package (use the classes in smelt, not these)";

  nb::register_exception_translator([](const std::exception_ptr &p, void *) {
    try {
      std::rethrow_exception(p);
    } catch (const SmeltError &e) {
      int code = e.code >= 0 && e.code < 6 ? e.code : 0;
      PyObject *cls = g_error_classes[code] ? g_error_classes[code] : g_error_classes[0];
      if (!cls) {
        PyErr_SetString(PyExc_RuntimeError, e.message.c_str());
        return;
      }
      // a message quoting a binary file may not be UTF-8
      PyObject *msg = PyUnicode_DecodeUTF8(e.message.data(), (Py_ssize_t)e.message.size(), "replace");
      if (!msg) return;
      PyObject *exc = PyObject_CallFunction(cls, "Oi", msg, e.code);
      Py_DECREF(msg);
      if (!exc) return;  // the constructor's own error stands
      PyErr_SetObject(cls, exc);
      Py_DECREF(exc);
    }
  });

  m.def("_set_error_classes", [](nb::list classes) {
    for (size_t i = 0; i < 6 && i < classes.size(); i++) {
      PyObject *c = classes[i].ptr();
      Py_INCREF(c);
      Py_XDECREF(g_error_classes[i]);
      g_error_classes[i] = c;
    }
  });
  m.def("version", [] { return std::string(smelt_version()); });

  nb::class_<Bundle>(m, "Bundle")
      .def_prop_ro("path", [](const Bundle &b) { return b.path; })
      .def_prop_ro("data", [](const Bundle &b) -> nb::object {
        return b.data.is_valid() ? b.data : nb::none();
      })
      .def("num_specialisations", &Bundle::num_specialisations)
      .def("inputs", [](const Bundle &b, int spec) { return b.infos(spec, 0); }, nb::arg("spec"))
      .def("outputs", [](const Bundle &b, int spec) { return b.infos(spec, 1); }, nb::arg("spec"))
      .def("states", [](const Bundle &b, int spec) { return b.infos(spec, 2); }, nb::arg("spec"))
      .def("specialisation_dims", &Bundle::specialisation_dims);

  m.def("open", &bundle_open, nb::arg("path"));
  m.def("compile", &compile_model, nb::arg("model_path"), nb::arg("targets").none(), nb::arg("dims").none(),
        nb::arg("dtype").none(), nb::arg("passes").none(), nb::arg("cpu").none(), nb::arg("onchip_bytes"),
        nb::arg("threads"), nb::arg("allow_tf32"), nb::arg("external_weights"), nb::arg("no_cache"),
        nb::arg("tp") = 1);

  nb::class_<Session>(m, "Session")
      .def("inputs", [](const Session &s) { return s.infos(0); })
      .def("outputs", [](const Session &s) { return s.infos(1); })
      .def("states", [](const Session &s) { return s.infos(2); })
      .def("run", &Session::run, nb::arg("inputs"), nb::arg("outputs"), nb::arg("execute"), nb::arg("sync"))
      .def("cuda_stream", &Session::cuda_stream)
      .def("alloc_cuda", &Session::alloc_cuda, nb::arg("shape"), nb::arg("dtype"))
      .def("select", &Session::select, nb::arg("i"))
      .def("specialisation", &Session::specialisation)
      .def("reset_state", &Session::reset_state)
      .def("read_state", &Session::read_state, nb::arg("name"), nb::arg("array"))
      .def("write_state", &Session::write_state, nb::arg("name"), nb::arg("array"));

  // the session keeps its bundle alive
  m.def("session", &session_create, nb::arg("bundle"), nb::arg("device"), nb::arg("threads"),
        nb::keep_alive<0, 1>());
}
