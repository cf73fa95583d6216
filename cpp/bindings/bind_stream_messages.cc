// tensorxfer._core: a persistent plan's streams between hosts, cut into messages
// (tensorxfer/resharding/stream_messages.h). The Python side
// (resharding/copy_services/_network_plan.py) posts the messages on a network
// engine; this side holds each message's copies and runs them, GIL released.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/copy/span_pack.h"
#include "tensorxfer/resharding/stream_messages.h"
#include "views_pieces.h"

namespace tensorxfer::bindings {
namespace {

std::vector<uint64_t> to_vector(const U64Array& array, const char* argument) {
  TENSORXFER_CHECK(InvalidArgument, array.ndim() == 1, argument, " must be a 1-d array, got ndim=", array.ndim());
  return std::vector<uint64_t>(array.data(), array.data() + array.shape(0));
}

// One side's messages of one stream, and the Python objects their memory belongs to.
struct PyStreamMessages {
  std::vector<resharding::StreamMessage> messages;
  copy::SpanStores stores = copy::SpanStores::kBySize;
  py::object keep_alive;

  const resharding::StreamMessage& at(std::size_t k) const {
    TENSORXFER_CHECK(InvalidArgument, k < messages.size(), "message ", k, " of ", messages.size());
    return messages[k];
  }
};

// Every view's pieces of one side, computed once for all of that side's streams.
class PyStreamViews {
 public:
  PyStreamViews(const U64Array& meta, const I64Array& dims, const std::string& side)
      : side_(checked_side(side)), views_(views_pieces(meta, dims, side_.c_str())) {}

  resharding::Pieces stream(const U64Array& items) const {
    const auto indices = to_vector(items, "items");
    std::vector<const resharding::Pieces*> parts;
    parts.reserve(indices.size());
    for (const uint64_t index : indices) {
      TENSORXFER_CHECK(InvalidArgument, index < views_.size(), side_, " stream item ", index, " of ", views_.size(),
                       " views");
      parts.push_back(&views_[index]);
    }
    return resharding::concatenate_pieces(parts);
  }

  std::size_t staged_count(const U64Array& items, const U64Array& sizes) const {
    return resharding::staged_count(stream(items), to_vector(sizes, "sizes"));
  }

  std::unique_ptr<PyStreamMessages> messages(const U64Array& items, const U64Array& sizes, const U64Array& staging,
                                             uint64_t staging_nbytes, bool streaming, py::object keep_alive) const {
    std::vector<std::byte*> buffers;
    for (const uint64_t address : to_vector(staging, "staging")) {
      buffers.push_back(reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(address)));
    }
    auto result = std::make_unique<PyStreamMessages>();
    const auto side = side_ == "sends" ? resharding::StreamSide::kSend : resharding::StreamSide::kReceive;
    result->messages = resharding::cut_stream(stream(items), to_vector(sizes, "sizes"), side, buffers, staging_nbytes);
    result->stores = streaming ? copy::SpanStores::kStreaming : copy::SpanStores::kBySize;
    result->keep_alive = std::move(keep_alive);
    return result;
  }

 private:
  static std::string checked_side(const std::string& side) {
    TENSORXFER_CHECK(InvalidArgument, side == "sends" || side == "receives", "side must be 'sends' or 'receives', got '",
                     side, "'");
    return side;
  }

  std::string side_;
  std::vector<resharding::Pieces> views_;
};

}  // namespace

void bind_stream_messages(py::module_& module) {
  module.def(
      "message_sizes",
      [](const U64Array& item_nbytes, uint64_t bucket_nbytes) {
        const auto sizes = resharding::message_sizes(to_vector(item_nbytes, "item_nbytes"), bucket_nbytes);
        py::array_t<uint64_t> result(static_cast<py::ssize_t>(sizes.size()));
        std::copy(sizes.begin(), sizes.end(), result.mutable_data());
        return result;
      },
      py::arg("item_nbytes"), py::arg("bucket_nbytes"),
      "The message sizes of a stream of items of these sizes (resharding/stream_messages.h): small items share "
      "buckets of at most bucket_nbytes, an item of half a bucket or more starts its own messages.");

  py::class_<PyStreamMessages>(module, "StreamMessages", "One side's messages of one stream (native).")
      .def_property_readonly("count", [](const PyStreamMessages& self) { return self.messages.size(); })
      .def_property_readonly("direct",
                             [](const PyStreamMessages& self) {
                               py::array_t<uint64_t> result(static_cast<py::ssize_t>(self.messages.size()));
                               auto* out = result.mutable_data();
                               for (std::size_t k = 0; k < self.messages.size(); ++k) {
                                 out[k] = reinterpret_cast<std::uintptr_t>(self.messages[k].direct);
                               }
                               return result;
                             },
                             "Each message's address in the user's memory (sent from / received into), 0 = staged.")
      .def_property_readonly("nbytes",
                             [](const PyStreamMessages& self) {
                               py::array_t<uint64_t> result(static_cast<py::ssize_t>(self.messages.size()));
                               auto* out = result.mutable_data();
                               for (std::size_t k = 0; k < self.messages.size(); ++k) out[k] = self.messages[k].nbytes;
                               return result;
                             })
      .def(
          "copy",
          [](const PyStreamMessages& self, std::size_t k, copy::CopyEngine* engine) {
            const auto& message = self.at(k);
            py::gil_scoped_release release;
            copy::copy_spans(message.copies, engine, self.stores);
          },
          py::arg("k"), py::arg("engine").none(true),
          "Packs message k into its staging buffer (a send side) or unpacks it from there (a receive side); "
          "nothing for a direct message. On `engine`'s threads and the caller, or the caller alone (None). "
          "GIL released.");

  py::class_<PyStreamViews>(module, "StreamViews", "Every view's pieces of one side of a plan (native).")
      .def(py::init<const U64Array&, const I64Array&, const std::string&>(), py::arg("meta"), py::arg("dims"),
           py::arg("side"), "From describe_views' (meta, dims); side is 'sends' or 'receives'.")
      .def("staged_count", &PyStreamViews::staged_count, py::arg("items"), py::arg("sizes"),
           "How many messages of the stream of these views (by index, in order) cut at `sizes` need staging.")
      .def("messages", &PyStreamViews::messages, py::arg("items"), py::arg("sizes"), py::arg("staging"),
           py::arg("staging_nbytes"), py::arg("streaming"), py::arg("keep_alive"),
           "The stream's messages; staged message k goes through staging[k % len(staging)] (addresses of buffers "
           "of staging_nbytes, kept alive by keep_alive with the views' memory); `streaming` writes copies with "
           "streaming stores.");
}

}  // namespace tensorxfer::bindings
