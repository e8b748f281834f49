// libFuzzer target: every RPC of strata.v1.Strata, through the real daemon.
// One DaemonServer (psync NVMe tier, emulated device, small caps) serves a
// Unix socket in a private temporary directory for the whole run; each input
// is a short session of calls on it:
//   input  := call*
//   call   := rpc:u8  length:u16le  request-bytes[length]
// `rpc` picks the method (modulo their number); the bytes are parsed as that
// method's request (raw protobuf: any bytes that parse are sent as they are).
// Session ids are random, so a request's session_id below 16 is replaced by
// a session an earlier AttachRank of the same input returned; jobs are
// addressed by name and need no help. After each input every job is deleted
// and the checkpoint root emptied, so inputs do not see each other.
// What must hold: the daemon never crashes or trips a sanitizer, and no call
// answers UNKNOWN (each error is mapped to a code naming the problem).
// Drain is left out: it stops the daemon accepting work for good.
//   build-hardening/daemon/fuzz/service_rpc_fuzz daemon/fuzz/corpus/service_rpc
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/daemon_config.h"
#include "daemon/daemon_server.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/grpcpp.h"
#include "strata/v1/strata.grpc.pb.h"

namespace strata {
namespace {

using Stub = strata::v1::Strata::Stub;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "service_rpc_fuzz: %s\n", what.c_str());
  std::abort();
}

struct World {
  std::string dir;
  std::unique_ptr<DaemonServer> server;
  std::unique_ptr<Stub> stub;
};

World* MakeWorld() {
  // Requests with invalid UTF-8 in a string field are refused by
  // ParseFromArray, which would log each one.
  google::protobuf::SetLogHandler(nullptr);
  auto* w = new World;
  char dir[] = "/tmp/strata-rpc-fuzz-XXXXXX";
  if (mkdtemp(dir) == nullptr) Fail("mkdtemp");
  w->dir = dir;
  // The directory (NVMe files of tens of MiB) goes when the run ends; a
  // crash leaves it for the post-mortem.
  static std::string* removed_at_exit = new std::string(w->dir);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(*removed_at_exit, ec);
  });
  strata::v1::DaemonConfig config;
  config.set_socket_path(w->dir + "/s.sock");
  config.add_nvme_paths(w->dir + "/nvme");
  config.set_nvme_capacity("96MiB");
  config.set_pinned_capacity("64MiB");
  config.set_device("emulated");
  config.set_device_capacity("64MiB");
  config.set_io_engine("psync");
  config.set_fsync_policy("never");
  config.set_optimizer_threads(1);
  config.set_checkpoint_root(w->dir + "/ckpt");
  // Small caps, so no request can make the fuzzer allocate gigabytes (an
  // operator sets them the same way).
  config.set_max_jobs_per_uid(4);
  config.set_max_tensors_per_job(256);
  config.set_max_tensor_elements(1 << 16);
  config.set_max_job_elements(1 << 18);
  config.set_max_region_bytes("16MiB");
  config.set_max_world_size(8);
  config.set_max_pending_waits(4);
  auto settings = ResolveDaemonSettings(config, "");
  if (!settings.ok()) Fail(settings.status().ToString());
  auto server = DaemonServer::Create(*settings, config, [](const std::string&) {});
  if (!server.ok()) Fail(server.status().ToString());
  w->server = std::move(*server);
  if (absl::Status s = w->server->Start(); !s.ok()) Fail(s.ToString());
  w->stub = strata::v1::Strata::NewStub(
      grpc::CreateChannel("unix:" + settings->socket_path, grpc::InsecureChannelCredentials()));
  return w;
}

// What an input has made so far.
struct Session {
  std::vector<uint64_t> session_ids;
};

void SetDeadline(grpc::ClientContext* context) {
  // Long enough for any call to run (a WaitStep on a step that never comes
  // waits this long), short enough for thousands of calls per second.
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(250));
}

// A session_id below 16 names the (n % count)-th session of this input.
void SubstituteSession(google::protobuf::Message* request, const Session& session) {
  const auto* field = request->GetDescriptor()->FindFieldByName("session_id");
  if (field == nullptr || field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_UINT64) return;
  const auto* reflection = request->GetReflection();
  const uint64_t value = reflection->GetUInt64(*request, field);
  if (value < 16 && !session.session_ids.empty()) {
    reflection->SetUInt64(request, field, session.session_ids[value % session.session_ids.size()]);
  }
}

void CheckStatus(const grpc::Status& status, const std::string& method) {
  // STRATA_FUZZ_VERBOSE=1: each call's outcome, to see how deep seeds reach.
  static const bool verbose = std::getenv("STRATA_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "%s: %d %s\n", method.c_str(), static_cast<int>(status.error_code()),
                 status.error_message().substr(0, 200).c_str());
  }
  if (status.error_code() == grpc::StatusCode::UNKNOWN) {
    Fail(method + " answered UNKNOWN: " + status.error_message());
  }
}

template <typename Request, typename Response>
using Method = grpc::Status (Stub::*)(grpc::ClientContext*, const Request&, Response*);

template <typename Request, typename Response>
std::function<void(const uint8_t*, size_t, Session*)> Rpc(const char* name, Method<Request, Response> method,
                                                          Stub* stub) {
  return [=](const uint8_t* data, size_t size, Session* session) {
    Request request;
    if (!request.ParseFromArray(data, static_cast<int>(size))) return;
    SubstituteSession(&request, *session);
    Response response;
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::Status status = (stub->*method)(&context, request, &response);
    CheckStatus(status, name);
    if (!status.ok()) return;
    const auto* field = response.GetDescriptor()->FindFieldByName("session_id");
    if (field != nullptr && field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT64) {
      const uint64_t id = response.GetReflection()->GetUInt64(response, field);
      if (id != 0) session->session_ids.push_back(id);
    }
  };
}

std::vector<std::function<void(const uint8_t*, size_t, Session*)>>* MakeRpcs(Stub* s) {
  using namespace strata::v1;
  // The order is the corpus's format: append new RPCs, never reorder.
  return new std::vector<std::function<void(const uint8_t*, size_t, Session*)>>{
      Rpc<GetStatusRequest, GetStatusResponse>("GetStatus", &Stub::GetStatus, s),                  // 0
      Rpc<NoopRequest, NoopResponse>("Noop", &Stub::Noop, s),                                      // 1
      Rpc<CreateJobRequest, CreateJobResponse>("CreateJob", &Stub::CreateJob, s),                  // 2
      Rpc<ListJobsRequest, ListJobsResponse>("ListJobs", &Stub::ListJobs, s),                      // 3
      Rpc<DeleteJobRequest, DeleteJobResponse>("DeleteJob", &Stub::DeleteJob, s),                  // 4
      Rpc<AttachRankRequest, AttachRankResponse>("AttachRank", &Stub::AttachRank, s),              // 5
      Rpc<HeartbeatRequest, HeartbeatResponse>("Heartbeat", &Stub::Heartbeat, s),                  // 6
      Rpc<DetachRankRequest, DetachRankResponse>("DetachRank", &Stub::DetachRank, s),              // 7
      Rpc<RegisterTensorsRequest, RegisterTensorsResponse>("RegisterTensors", &Stub::RegisterTensors, s),  // 8
      Rpc<InitParamsRequest, InitParamsResponse>("InitParams", &Stub::InitParams, s),              // 9
      Rpc<GradReadyRequest, GradReadyResponse>("GradReady", &Stub::GradReady, s),                  // 10
      Rpc<WaitStepRequest, WaitStepResponse>("WaitStep", &Stub::WaitStep, s),                      // 11
      Rpc<BeginStepRequest, BeginStepResponse>("BeginStep", &Stub::BeginStep, s),                  // 12
      Rpc<PrepareStepRequest, PrepareStepResponse>("PrepareStep", &Stub::PrepareStep, s),          // 13
      Rpc<CommitStepRequest, CommitStepResponse>("CommitStep", &Stub::CommitStep, s),              // 14
      Rpc<AcquireRequest, AcquireResponse>("Acquire", &Stub::Acquire, s),                          // 15
      Rpc<ReleaseRequest, ReleaseResponse>("Release", &Stub::Release, s),                          // 16
      Rpc<IterationBoundaryRequest, IterationBoundaryResponse>("IterationBoundary", &Stub::IterationBoundary,
                                                               s),                                 // 17
      Rpc<SaveCheckpointRequest, SaveCheckpointResponse>("SaveCheckpoint", &Stub::SaveCheckpoint, s),  // 18
      Rpc<LoadCheckpointRequest, LoadCheckpointResponse>("LoadCheckpoint", &Stub::LoadCheckpoint, s),  // 19
      Rpc<GetStatsRequest, GetStatsResponse>("GetStats", &Stub::GetStats, s),                      // 20
      Rpc<ParkJobRequest, ParkJobResponse>("ParkJob", &Stub::ParkJob, s),                          // 21
      Rpc<ResumeJobRequest, ResumeJobResponse>("ResumeJob", &Stub::ResumeJob, s),                  // 22
  };
}

// Deletes every job and every checkpoint, so the next input starts afresh.
void Reset(World* w) {
  strata::v1::ListJobsResponse jobs;
  {
    grpc::ClientContext context;
    // Housekeeping, not under test: a loaded machine may take a while.
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status s = w->stub->ListJobs(&context, strata::v1::ListJobsRequest(), &jobs);
    if (!s.ok()) Fail("ListJobs after an input: " + s.error_message());
  }
  for (const strata::v1::JobInfo& job : jobs.jobs()) {
    strata::v1::DeleteJobRequest request;
    request.set_job(job.name());
    strata::v1::DeleteJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status s = w->stub->DeleteJob(&context, request, &response);
    if (!s.ok()) Fail("DeleteJob '" + job.name() + "' after an input: " + s.error_message());
  }
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(w->dir + "/ckpt", ec)) {
    std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace
}  // namespace strata

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  static World* world = MakeWorld();
  static auto* rpcs = MakeRpcs(world->stub.get());
  Session session;
  size_t at = 0;
  for (int calls = 0; calls < 16 && at + 3 <= size; ++calls) {
    const size_t which = data[at] % rpcs->size();
    const size_t length = std::min<size_t>(data[at + 1] | (size_t{data[at + 2]} << 8), size - at - 3);
    (*rpcs)[which](data + at + 3, length, &session);
    at += 3 + length;
  }
  Reset(world);
  return 0;
}
