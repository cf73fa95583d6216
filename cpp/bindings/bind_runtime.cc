// tensorxfer._core.HostStream and HostEvent.
//
// Lifetime rule: a queued copy holds raw pointers only. The Python owners of
// its two tensors stay in the stream's `owners_` list, tagged with the copy's
// sequence number, and are dropped (holding the GIL, on a Python thread) once
// the stream reports that sequence done: checked at every enqueue, record,
// synchronize, query and close. Dropping user tensors early is therefore safe.
#include <pybind11/stl.h>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "bindings.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/runtime/event.h"
#include "tensorxfer/runtime/stream.h"

namespace tensorxfer::bindings {
namespace {

using runtime::HostEvent;
using runtime::HostStream;
using runtime::Seconds;

// The package's timeout rules (bindings.h), as the runtime's optional seconds.
std::optional<Seconds> runtime_timeout(const py::handle& timeout, const std::string& operation) {
  const std::chrono::nanoseconds parsed = wait_timeout(timeout, operation);
  if (parsed == kNoDeadline) return std::nullopt;
  return std::chrono::duration_cast<Seconds>(parsed);
}

PyTensorView view_argument(const py::handle& object, const char* argument) {
  if (py::isinstance<PyTensorView>(object)) return object.cast<PyTensorView>();
  return make_view(object, argument);
}

class PyHostStream {
 public:
  static constexpr double kDefaultCloseSeconds = 30.0;

  explicit PyHostStream(py::object engine) : engine_owner_(std::move(engine)) {
    if (!engine_owner_.is_none() && !py::isinstance<copy::CopyEngine>(engine_owner_)) {
      throw TypeMismatch("HostStream: engine must be a CopyEngine or None, got " +
                         std::string(py::str(py::type::of(engine_owner_).attr("__name__"))));
    }
    copy::CopyEngine* native = engine_owner_.is_none() ? nullptr : engine_owner_.cast<copy::CopyEngine*>();
    stream_ = std::make_unique<HostStream>(native);
  }

  ~PyHostStream() {
    {
      py::gil_scoped_release release;
      stream_.reset();  // drains (bounded), cancels the rest, joins the worker
    }
    owners_.clear();  // every task is finished now; the GIL is held again
  }

  PyHostStream(const PyHostStream&) = delete;
  PyHostStream& operator=(const PyHostStream&) = delete;

  void enqueue_copy(const py::handle& dst, const py::handle& src) {
    release_finished();
    PyTensorView out = view_argument(dst, "dst");
    PyTensorView in = view_argument(src, "src");
    const uint64_t sequence = stream_->enqueue_copy(out.view, in.view);
    owners_.emplace_back(sequence, py::make_tuple(std::move(out.owner), std::move(in.owner)));
  }

  void record(HostEvent& event) {
    release_finished();
    stream_->record(event);
  }

  void wait_event(const HostEvent& event) {
    release_finished();
    stream_->wait_event(event);
  }

  void synchronize(const PyTimeout& timeout_seconds) {
    const auto timeout = runtime_timeout(timeout_seconds, "HostStream.synchronize");
    const sync::WaitHook hook = python_signal_check();
    try {
      py::gil_scoped_release release;
      stream_->synchronize(timeout, hook);
    } catch (...) {
      release_finished();
      throw;
    }
    release_finished();
  }

  bool query() {
    const bool idle = stream_->query();
    release_finished();
    return idle;
  }

  void close(const PyTimeout& timeout_seconds) {
    const auto timeout = runtime_timeout(timeout_seconds, "HostStream.close");
    const sync::WaitHook hook = python_signal_check();
    try {
      py::gil_scoped_release release;
      stream_->close(timeout.value_or(Seconds::max()), hook);
    } catch (...) {
      release_finished();
      throw;
    }
    release_finished();
  }

  bool closed() const { return stream_->closed(); }
  uint64_t completed_sequence() const { return stream_->completed_sequence(); }
  uint64_t enqueued_sequence() const { return stream_->enqueued_sequence(); }
  std::size_t pending_owners() const { return owners_.size(); }

 private:
  // Drops the owners of finished copies. They are moved out first so that a
  // destructor running Python code that re-enters this stream sees a
  // consistent list.
  void release_finished() {
    const uint64_t done = stream_->completed_sequence();
    std::vector<py::object> finished;
    while (!owners_.empty() && owners_.front().first <= done) {
      finished.push_back(std::move(owners_.front().second));
      owners_.pop_front();
    }
  }

  py::object engine_owner_;  // keeps the CopyEngine alive while the stream may use it
  std::unique_ptr<HostStream> stream_;
  std::deque<std::pair<uint64_t, py::object>> owners_;
};

}  // namespace

void bind_runtime(py::module_& module) {
  py::class_<HostEvent>(module, "HostEvent",
                        "A marker recorded on a HostStream: done once the work enqueued before "
                        "the record has run.")
      .def(py::init<>())
      .def("query", &HostEvent::query,
           "True if never recorded or the latest record is done. Never blocks.")
      .def(
          "wait",
          [](const HostEvent& event, const PyTimeout& timeout_seconds) {
            const auto timeout = runtime_timeout(timeout_seconds, "HostEvent.wait");
            const sync::WaitHook hook = python_signal_check();
            py::gil_scoped_release release;
            event.wait(timeout, hook);
          },
          py::arg("timeout") = py::none(),
          "Blocks until the latest record is done (GIL released). ``timeout``: seconds, 0 = check "
          "once, None = no deadline (Ctrl-C still interrupts: KeyboardInterrupt). Raises "
          "TimeoutError, or the error of a failed task before the record.")
      .def("reset", &HostEvent::reset, "Back to never recorded.");

  py::class_<PyHostStream>(module, "HostStream",
                           "A worker thread running a FIFO of host copies, event records and "
                           "event waits, CUDA-stream style.")
      .def(py::init<py::object>(), py::arg("engine") = py::none(),
           "Copies go through `engine` (a CopyEngine, kept alive by the stream) when given, "
           "else a memcpy on the stream's thread.")
      .def("enqueue_copy", &PyHostStream::enqueue_copy, py::arg("dst"), py::arg("src"),
           "Queues a copy of src's bytes into dst and returns at once. The stream keeps both "
           "tensors alive until the copy is done. ValueError for size mismatch, non-host, "
           "non-contiguous or read-only dst, or a closed stream.")
      .def("record", &PyHostStream::record, py::arg("event"),
           "Records `event`: done once everything enqueued before has run.")
      .def("wait_event", &PyHostStream::wait_event, py::arg("event"),
           "Work enqueued after this waits for `event`'s latest record.")
      .def("synchronize", &PyHostStream::synchronize, py::arg("timeout") = py::none(),
           "Blocks until everything enqueued so far has run (GIL released). ``timeout``: "
           "seconds, 0 = check once, None = no deadline (Ctrl-C still interrupts: "
           "KeyboardInterrupt). Raises TimeoutError, or the error of a failed task (once).")
      .def("query", &PyHostStream::query, "True when everything enqueued has run. Never blocks.")
      .def("close", &PyHostStream::close, py::arg("timeout") = PyHostStream::kDefaultCloseSeconds,
           "Stops accepting work, lets pending work run for up to `timeout` seconds (None: no "
           "deadline), cancels the rest (TimeoutError then) and joins the worker. Idempotent. "
           "Ctrl-C during the wait raises KeyboardInterrupt; the work keeps running and close "
           "may be called again.")
      .def_property_readonly("closed", &PyHostStream::closed)
      .def_property_readonly("completed_sequence", &PyHostStream::completed_sequence,
                             "Every task numbered up to this has finished.")
      .def_property_readonly("enqueued_sequence", &PyHostStream::enqueued_sequence,
                             "Number of the latest enqueued task, or 0 if none was.")
      .def_property_readonly("_pending_owners", &PyHostStream::pending_owners,
                             "Tensors held for copies not yet seen finished (for tests).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyHostStream& stream, py::args) {
        stream.close(PyTimeout(py::float_(PyHostStream::kDefaultCloseSeconds)));
      });
}

}  // namespace tensorxfer::bindings
