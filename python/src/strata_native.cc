// strata._native: the Python binding of client/ (StrataClient, RankSession).
//
// One implementation of the protocol: this file only converts between Python
// and the C++ client. Failures raise strata.StrataError carrying the absl
// status code's name. Calls that may block (every RPC) release the GIL, so a
// gradient hand-off from a backward hook or a collective on another thread
// keeps running while a rank waits on the daemon.
//
// Shared slots are exposed as `Slot` objects with the buffer protocol (bytes,
// writable) over the mapped exchange region: torch.frombuffer(slot, dtype=...)
// makes a tensor without a copy, and nothing here knows torch's C++ ABI. A
// Slot holds the session alive, so the region stays mapped while any tensor
// over it exists; the session detaches when its last holder goes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/strata_client.h"

namespace py = pybind11;

namespace strata {
namespace {

// strata.StrataError, created at import.
PyObject* g_strata_error = nullptr;

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

[[noreturn]] void Raise(const absl::Status& status) {
  py::gil_scoped_acquire gil;
  py::object error = py::reinterpret_borrow<py::object>(g_strata_error);
  py::object instance = error(std::string(status.message()), CodeName(status.code()));
  PyErr_SetObject(g_strata_error, instance.ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Take(absl::StatusOr<T> result) {
  if (!result.ok()) Raise(result.status());
  return *std::move(result);
}

// Runs a daemon call without the GIL (it may block for a whole step, and
// other Python threads -- DataLoader workers, the Trainer's -- must run),
// then raises its error as StrataError or returns its value.
template <typename Call>
auto WithoutGil(Call&& call) {
  auto result = [&] {
    py::gil_scoped_release release;
    return call();
  }();
  if constexpr (std::is_same_v<decltype(result), absl::Status>) {
    Check(result);
  } else {
    return Take(std::move(result));
  }
}

absl::StatusOr<DType> DTypeArg(const std::string& name) { return ParseDType(name); }

// One shard of a trainer-supplied partition, as Python passes it.
using PartitionShard =
    std::tuple<uint32_t, uint64_t, std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint64_t>>>;

// A session shared by the Python Session object and every Slot over its region.
using SessionPtr = std::shared_ptr<RankSession>;

// One grad or param slot of a shard: `bytes` bytes at `data` in the region.
struct Slot {
  SessionPtr owner;
  std::byte* data = nullptr;
  uint64_t bytes = 0;
};

// The daemon's emulated device arena as this session mapped it (read-only).
struct ArenaView {
  SessionPtr owner;
  const std::byte* data = nullptr;
  uint64_t bytes = 0;
};

py::dict ParkDict(const ParkResult& r) {
  py::dict d;
  d["tier"] = std::string(TierKindName(r.tier));
  d["shards"] = r.shards;
  d["bytes"] = r.bytes;
  d["seconds"] = r.seconds;
  d["gb_per_s"] = r.bytes_per_second() / 1e9;
  return d;
}

struct PySession {
  SessionPtr session;

  RankSession& get() {
    if (!session) Raise(absl::FailedPreconditionError("the session is closed"));
    return *session;
  }
};

py::dict Summary(const JobSummary& j) {
  py::dict d;
  d["job_id"] = j.job_id;
  d["name"] = j.name;
  d["world_size"] = j.world_size;
  d["attached_ranks"] = j.attached_ranks;
  d["step"] = j.step;
  d["loss_scale"] = j.loss_scale;
  d["shards_stepped_early"] = j.shards_stepped_early;
  return d;
}

JobSpec SpecFromArgs(const std::string& name, uint32_t world_size, const std::string& mode,
                     const std::string& deepspeed_config_json, const std::string& param_dtype,
                     const std::string& grad_dtype, uint64_t pinned_budget_bytes,
                     uint64_t device_budget_bytes, bool attach_if_exists, const py::object& optimizer,
                     const std::vector<uint32_t>& local_ranks, bool external_step_agreement) {
  JobSpec spec;
  spec.local_ranks = local_ranks;
  spec.external_step_agreement = external_step_agreement;
  spec.name = name;
  spec.world_size = world_size;
  if (mode == "offload") {
    spec.mode = JobMode::kOffload;
  } else if (mode == "infinity") {
    spec.mode = JobMode::kInfinity;
  } else {
    Raise(absl::InvalidArgumentError(absl::StrCat("mode '", mode, "': expected 'offload' or 'infinity'")));
  }
  spec.deepspeed_config_json = deepspeed_config_json;
  spec.param_dtype = Take(DTypeArg(param_dtype));
  spec.grad_dtype = Take(DTypeArg(grad_dtype));
  spec.pinned_budget_bytes = pinned_budget_bytes;
  spec.device_budget_bytes = device_budget_bytes;
  spec.attach_if_exists = attach_if_exists;
  if (!optimizer.is_none()) {
    py::dict o = optimizer.cast<py::dict>();
    spec.optimizer.type = o["type"].cast<std::string>();
    spec.optimizer.lr = o.contains("lr") ? o["lr"].cast<double>() : 0.0;
    spec.optimizer.beta1 = o.contains("beta1") ? o["beta1"].cast<double>() : 0.0;
    spec.optimizer.beta2 = o.contains("beta2") ? o["beta2"].cast<double>() : 0.0;
    spec.optimizer.eps = o.contains("eps") ? o["eps"].cast<double>() : 0.0;
    spec.optimizer.weight_decay = o.contains("weight_decay") ? o["weight_decay"].cast<double>() : 0.0;
    spec.optimizer.amsgrad = o.contains("amsgrad") ? o["amsgrad"].cast<bool>() : false;
  }
  return spec;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "strata's client (client/strata_client.h) for Python";
  py::object error_type = py::module_::import("strata.errors").attr("StrataError");
  g_strata_error = error_type.ptr();
  Py_INCREF(g_strata_error);

  py::class_<Slot>(m, "Slot", py::buffer_protocol())
      .def_property_readonly("nbytes", [](const Slot& s) { return s.bytes; })
      .def_buffer([](Slot& s) {
        return py::buffer_info(s.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.bytes)}, {1}, /*readonly=*/false);
      });

  py::class_<ArenaView>(m, "ArenaView", py::buffer_protocol())
      .def_property_readonly("nbytes", [](const ArenaView& a) { return a.bytes; })
      .def_buffer([](ArenaView& a) {
        return py::buffer_info(const_cast<std::byte*>(a.data), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(a.bytes)}, {1}, /*readonly=*/true);
      });

  py::class_<PySession>(m, "Session")
      .def_property_readonly("job_id", [](PySession& s) { return s.get().job_id(); })
      .def_property_readonly("rank", [](PySession& s) { return s.get().rank(); })
      .def_property_readonly("reattached", [](PySession& s) { return s.get().reattached(); })
      .def_property_readonly("step", [](PySession& s) { return s.get().step(); })
      .def_property_readonly("stage", [](PySession& s) { return s.get().stage(); })
      .def_property_readonly("init_batch_bytes", [](PySession& s) { return s.get().init_batch_bytes(); })
      .def_property_readonly("param_dtype",
                             [](PySession& s) { return std::string(DTypeName(s.get().param_dtype())); })
      .def_property_readonly("grad_dtype",
                             [](PySession& s) { return std::string(DTypeName(s.get().grad_dtype())); })
      .def(
          "register_tensors",
          [](PySession& s, const std::vector<std::tuple<std::string, uint64_t, uint32_t>>& tensors,
             const std::vector<PartitionShard>& partition) {
            std::vector<TensorDesc> descs;
            descs.reserve(tensors.size());
            for (const auto& [name, numel, group] : tensors) descs.push_back(TensorDesc{name, numel, group});
            std::vector<ShardLayoutSpec> layout;
            layout.reserve(partition.size());
            for (const auto& [index, padded_numel, ranges] : partition) {
              ShardLayoutSpec shard;
              shard.index = index;
              shard.padded_numel = padded_numel;
              for (const auto& [tensor, tensor_offset, numel, shard_offset] : ranges) {
                shard.ranges.push_back(OwnedRange{TensorId(tensor), tensor_offset, numel, shard_offset});
              }
              layout.push_back(std::move(shard));
            }
            RankSession& session = s.get();
            WithoutGil([&] { return session.RegisterTensors(descs, layout); });
          },
          py::arg("tensors"), py::arg("partition") = std::vector<PartitionShard>{},
          "Registers [(name, numel, group), ...] (the same list on every rank) and maps the region. "
          "partition: this rank's own shards [(index, padded_numel, [(tensor, tensor_offset, numel, "
          "shard_offset), ...]), ...]; empty: the daemon's ZeRO layout.")
      .def(
          "shards",
          [](PySession& s) {
            RankSession& session = s.get();
            const uint64_t gsize = DTypeSize(session.grad_dtype());
            const uint64_t psize = DTypeSize(session.param_dtype());
            py::list out;
            for (const ShardView& shard : session.shards()) {
              py::dict d;
              d["index"] = shard.index;
              d["padded_numel"] = shard.padded_numel;
              py::list ranges;
              for (const OwnedRange& r : shard.ranges) {
                ranges.append(py::make_tuple(r.tensor.value(), r.tensor_offset, r.numel, r.shard_offset));
              }
              d["ranges"] = ranges;
              d["grad"] = Slot{s.session, shard.grad, shard.padded_numel * gsize};
              d["param"] = Slot{s.session, shard.param, shard.padded_numel * psize};
              out.append(d);
            }
            return out;
          },
          "This rank's shards: dicts of index, padded_numel, ranges [(tensor, tensor_offset, numel, "
          "shard_offset)], grad and param (Slot, a writable byte buffer).")
      .def(
          "init_params",
          [](PySession& s, const std::vector<uint32_t>& indices) {
            RankSession& session = s.get();
            WithoutGil([&] { return session.InitParams(indices); });
          },
          py::arg("indices") = std::vector<uint32_t>{},
          "The initial params of shards `indices` (every shard when empty) are in their param slots. "
          "With init_batch_bytes set, write and send them in batches of at most that many bytes.")
      .def(
          "begin_step",
          [](PySession& s, uint64_t step, const std::vector<py::dict>& groups) {
            std::vector<GroupHyperparams> hyper;
            hyper.reserve(groups.size());
            for (const py::dict& g : groups) {
              GroupHyperparams h;
              h.lr = g["lr"].cast<double>();
              h.beta1 = g["beta1"].cast<double>();
              h.beta2 = g["beta2"].cast<double>();
              h.eps = g["eps"].cast<double>();
              h.weight_decay = g["weight_decay"].cast<double>();
              h.lr_decay = g["lr_decay"].cast<double>();
              hyper.push_back(h);
            }
            RankSession& session = s.get();
            WithoutGil([&] { return session.BeginStep(step, hyper); });
          },
          py::arg("step"), py::arg("groups"),
          "Step `step`'s hyperparameters per param group: dicts of lr, beta1, beta2, eps, weight_decay, "
          "lr_decay.")
      .def(
          "wait_grad_room",
          [](PySession& s, uint32_t index) {
            RankSession& session = s.get();
            WithoutGil([&] { return session.WaitGradRoom(index); });
          },
          py::arg("index"),
          "ZeRO-Infinity: waits until the rank's gradient window has room for shard `index`'s gradient; call "
          "before writing its grad slot (the window then stays within the job's pinned budget).")
      .def(
          "write_grad",
          [](PySession& s, uint32_t index, const py::buffer& data, uint64_t offset) {
            RankSession& session = s.get();
            const py::buffer_info info = data.request();
            if (info.ndim != 1 || info.strides[0] != info.itemsize) {
              throw py::value_error("write_grad: the gradient must be one contiguous run of bytes (a 1-D buffer)");
            }
            const uint64_t bytes = static_cast<uint64_t>(info.size) * static_cast<uint64_t>(info.itemsize);
            WithoutGil([&] { return session.WriteGrad(index, info.ptr, bytes, offset); });
          },
          py::arg("index"), py::arg("data"), py::arg("offset") = 0,
          "Waits for room (wait_grad_room), then copies `data` (a contiguous 1-D buffer, e.g. "
          "tensor.view(torch.uint8).numpy()) into shard `index`'s grad slot at byte `offset`, the fastest way "
          "there is (streaming stores, or pwrite into a slot the daemon discarded).")
      .def(
          "grad_ready",
          [](PySession& s, uint32_t index, uint64_t step) {
            RankSession& session = s.get();
            WithoutGil([&] { return session.GradReady(index, step); });
          },
          py::arg("index"), py::arg("step"))
      .def(
          "wait_step",
          [](PySession& s, uint64_t step) {
            RankSession& session = s.get();
            StepResult r = WithoutGil([&] { return session.WaitStep(step); });
            py::dict d;
            d["skipped"] = r.skipped;
            d["loss_scale"] = r.loss_scale;
            d["grad_norm"] = r.grad_norm;
            d["optimizer_steps"] = r.optimizer_steps;
            return d;
          },
          py::arg("step"))
      .def(
          "prepare_step",
          [](PySession& s, uint64_t step) {
            RankSession& session = s.get();
            LocalStepStats st = WithoutGil([&] { return session.PrepareStep(step); });
            return py::make_tuple(st.overflow, st.squared_norm);
          },
          py::arg("step"), "(overflow, squared_norm) of this daemon's ranks for `step`, once all are in.")
      .def(
          "commit_step",
          [](PySession& s, uint64_t step, bool overflow, double squared_norm) {
            RankSession& session = s.get();
            WithoutGil([&] { return session.CommitStep(step, overflow, squared_norm); });
          },
          py::arg("step"), py::arg("overflow"), py::arg("squared_norm"))
      .def(
          "acquire",
          [](PySession& s, const std::vector<uint32_t>& indices) {
            RankSession& session = s.get();
            WithoutGil([&] { return session.Acquire(indices); });
          },
          py::arg("indices"))
      .def(
          "acquire_places",
          [](PySession& s, const std::vector<uint32_t>& indices, const std::string& tier) {
            absl::StatusOr<TierKind> kind = ParseTierKind(tier);
            Check(kind.status());
            RankSession& session = s.get();
            py::list out;
            for (const ShardPlace& p : WithoutGil([&] { return session.Acquire(indices, *kind); })) {
              out.append(py::make_tuple(p.index, std::string(TierKindName(p.tier)), p.offset, p.bytes));
            }
            return out;
          },
          py::arg("indices"), py::arg("tier") = "device",
          "Acquire into `tier` ('device' or 'pinned_host'): a list of (index, tier, offset, bytes), "
          "offsets in the device arena (device_arena()) or the shared window.")
      .def(
          "device_arena",
          [](PySession& s) -> py::object {
            const DeviceArenaView& arena = s.get().device_arena();
            if (arena.kind != DeviceArenaView::Kind::kMemfd) {
              Check(s.get().device_error());
              Raise(absl::FailedPreconditionError(
                  arena.kind == DeviceArenaView::Kind::kNone
                      ? "no device arena in this session (a job without a device budget, or no device tier)"
                      : "the device arena is GPU memory (CUDA IPC); it has no host view"));
            }
            return py::cast(ArenaView{s.session, arena.host, arena.bytes});
          },
          "The emulated device arena, read-only (buffer protocol): a placed shard is "
          "arena[offset:offset + bytes].")
      .def(
          "release",
          [](PySession& s, const std::vector<uint32_t>& indices) {
            RankSession& session = s.get();
            WithoutGil([&] { return session.Release(indices); });
          },
          py::arg("indices"))
      .def("iteration_boundary",
           [](PySession& s) {
             RankSession& session = s.get();
             WithoutGil([&] { return session.IterationBoundary(); });
           })
      .def(
          "close", [](PySession& s) { s.session.reset(); },
          "Drops this handle; the rank detaches once no Slot over its region is left.");

  py::class_<StrataClient>(m, "Client")
      .def(py::init([](const std::string& socket_path, double rpc_timeout_s, double step_timeout_s) {
             ClientOptions options;
             options.socket_path = socket_path;
             options.rpc_timeout = absl::Seconds(rpc_timeout_s);
             options.step_timeout = absl::Seconds(step_timeout_s);
             return WithoutGil([&] { return StrataClient::Connect(options); });
           }),
           py::arg("socket_path"), py::arg("rpc_timeout_s") = 30.0, py::arg("step_timeout_s") = 300.0)
      .def(
          "create_job",
          [](StrataClient& c, const std::string& name, uint32_t world_size, const std::string& mode,
             const std::string& deepspeed_config_json, const std::string& param_dtype,
             const std::string& grad_dtype, uint64_t pinned_budget_bytes, uint64_t device_budget_bytes,
             bool attach_if_exists, const py::object& optimizer, const std::vector<uint32_t>& local_ranks,
             bool external_step_agreement) {
            JobSpec spec = SpecFromArgs(name, world_size, mode, deepspeed_config_json, param_dtype, grad_dtype,
                                        pinned_budget_bytes, device_budget_bytes, attach_if_exists, optimizer,
                                        local_ranks, external_step_agreement);
            return WithoutGil([&] { return c.CreateJob(spec); });
          },
          py::arg("name"), py::arg("world_size"), py::arg("mode") = "offload",
          py::arg("deepspeed_config_json") = "{}", py::arg("param_dtype") = "fp32",
          py::arg("grad_dtype") = "fp32", py::arg("pinned_budget_bytes") = 0, py::arg("device_budget_bytes") = 0,
          py::arg("attach_if_exists") = false, py::arg("optimizer") = py::none(),
          py::arg("local_ranks") = std::vector<uint32_t>{}, py::arg("external_step_agreement") = false,
          "Creates a job; returns its id. local_ranks: the ranks this daemon serves (empty: all); "
          "external_step_agreement: steps are agreed across daemons with prepare_step/commit_step.")
      .def("list_jobs",
           [](StrataClient& c) {
             py::list out;
             for (const JobSummary& j : WithoutGil([&] { return c.ListJobs(); })) out.append(Summary(j));
             return out;
           })
      .def(
          "delete_job",
          [](StrataClient& c, const std::string& job) {
            WithoutGil([&] { return c.DeleteJob(job); });
          },
          py::arg("job"))
      .def(
          "attach",
          [](StrataClient& c, const std::string& job, uint32_t rank) {
            return PySession{SessionPtr(WithoutGil([&] { return c.Attach(job, rank); }))};
          },
          py::arg("job"), py::arg("rank"))
      .def(
          "save_checkpoint",
          [](StrataClient& c, const std::string& job, const std::string& directory) {
            return WithoutGil([&] { return c.SaveCheckpointPath(job, directory); });
          },
          py::arg("job"), py::arg("directory"),
          "Saves the job beneath this caller's checkpoint home; returns the checkpoint's absolute path.")
      .def(
          "checkpoint_home",
          [](StrataClient& c) {
            return WithoutGil([&] { return c.CheckpointHome(); });
          },
          "Where this caller's checkpoint directories resolve on the daemon's host.")
      .def(
          "load_checkpoint",
          [](StrataClient& c, const std::string& directory, const std::string& new_job_name) {
            return WithoutGil([&] { return c.LoadCheckpoint(directory, new_job_name); });
          },
          py::arg("directory"), py::arg("new_job_name"))
      .def(
          "park_job",
          [](StrataClient& c, const std::string& job, const std::string& tier) {
            absl::StatusOr<TierKind> kind = ParseTierKind(tier);
            Check(kind.status());
            return ParkDict(WithoutGil([&] { return c.ParkJob(job, *kind); }));
          },
          py::arg("job"), py::arg("tier") = "nvme")
      .def(
          "resume_job",
          [](StrataClient& c, const std::string& job) {
            return ParkDict(WithoutGil([&] { return c.ResumeJob(job); }));
          },
          py::arg("job"))
      .def("stats_text",
           [](StrataClient& c) {
             return WithoutGil([&] { return c.StatsText(); });
           })
      .def("noop", [](StrataClient& c) {
        WithoutGil([&] { return c.Noop(); });
      });
}

}  // namespace strata
