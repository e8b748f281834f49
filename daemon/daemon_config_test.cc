#include "daemon/daemon_config.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DaemonConfigTest, ReadsTextFormatAndResolvesDefaults) {
  std::string path = WriteTemp("stratad.textpb", R"(
    socket_path: "/tmp/strata-test/d.sock"
    nvme_paths: "/var/tmp/nvme0"
    pinned_capacity: "8GiB"
    io_engine: "psync"
  )");
  auto config = LoadDaemonConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  auto s = ResolveDaemonSettings(*config, "");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->socket_path, "/tmp/strata-test/d.sock");
  EXPECT_EQ(s->pinned_capacity_bytes, 8ull << 30);
  EXPECT_EQ(s->io_engine, IoEngineChoice::kPsync);
  EXPECT_EQ(s->io_block_size, 1ull << 20);
  EXPECT_EQ(s->io_queue_depth, 8u);
  EXPECT_EQ(s->fsync_policy, FsyncPolicy::kEveryCommit);
  EXPECT_GE(s->optimizer_threads, 1u);
  EXPECT_NE(DescribeDaemonSettings(*s).find("io_engine: psync"), std::string::npos);
}

TEST(DaemonConfigTest, ReadsJson) {
  std::string path = WriteTemp("stratad.json", R"({"socketPath": "/tmp/x.sock", "ioQueueDepth": 32,
                                                    "device": "emulated", "deviceCapacity": "64MiB"})");
  auto config = LoadDaemonConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  auto s = ResolveDaemonSettings(*config, "/run/user/1000");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->io_queue_depth, 32u);
  EXPECT_EQ(s->device, DeviceChoice::kEmulated);
  EXPECT_EQ(s->device_capacity_bytes, 64ull << 20);
}

TEST(DaemonConfigTest, DeviceNoneTakesNoCapacity) {
  strata::v1::DaemonConfig c;
  c.set_device("none");
  c.set_device_capacity("0");
  auto s = ResolveDaemonSettings(c, "");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->device, DeviceChoice::kNone);
  EXPECT_NE(DescribeDaemonSettings(*s).find("device: none\n"), std::string::npos);
  strata::v1::DaemonConfig d;  // the default: auto, 1 GiB
  auto t = ResolveDaemonSettings(d, "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->device, DeviceChoice::kAuto);
  EXPECT_EQ(t->device_capacity_bytes, 1ull << 30);
}

TEST(DaemonConfigTest, DefaultSocketFollowsXdgRuntimeDir) {
  strata::v1::DaemonConfig c;
  EXPECT_EQ(ResolveDaemonSettings(c, "/run/user/1000")->socket_path,
            "/run/user/1000/strata/stratad.sock");
  EXPECT_EQ(ResolveDaemonSettings(c, "")->socket_path, "/run/strata/stratad.sock");
}

TEST(DaemonConfigTest, BadValuesNameTheField) {
  struct Case {
    const char* text;
    const char* must_mention;
  };
  for (const Case& c : {Case{"io_engine: \"spdk\"", "io_engine: 'spdk'"},
                        Case{"pinned_capacity: \"12XB\"", "pinned_capacity"},
                        Case{"io_block_size: \"1000\"", "io_block_size"},
                        Case{"fsync_policy: \"sometimes\"", "fsync_policy"},
                        Case{"nvme_paths: \"relative/dir\"", "nvme_paths"},
                        Case{"device: \"tpu\"", "device"},
                        Case{"device_capacity: \"0\"", "device_capacity"},
                        Case{"device_capacity: \"1000\"", "device_capacity"}}) {
    std::string path = WriteTemp("bad.textpb", c.text);
    auto config = LoadDaemonConfigFile(path);
    ASSERT_TRUE(config.ok()) << config.status();
    auto s = ResolveDaemonSettings(*config, "");
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_NE(s.status().message().find(c.must_mention), std::string::npos) << s.status();
  }
}

TEST(DaemonConfigTest, JobWorkerPoolIsBoundedWithAPerCoreDefault) {
  strata::v1::DaemonConfig c;
  auto s = ResolveDaemonSettings(c, "");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE(s->job_worker_threads, 2u);
  EXPECT_LE(s->job_worker_threads, 64u);
  c.set_job_worker_threads(3);
  EXPECT_EQ(ResolveDaemonSettings(c, "")->job_worker_threads, 3u);
  EXPECT_NE(DescribeDaemonSettings(*ResolveDaemonSettings(c, "")).find("job_worker_threads: 3"), std::string::npos);
  c.set_job_worker_threads(100000);
  auto bad = ResolveDaemonSettings(c, "");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("job_worker_threads"), std::string::npos) << bad.status();
}

TEST(DaemonConfigTest, UnknownFieldsAndMissingFilesAreErrors) {
  std::string path = WriteTemp("unknown.textpb", "sokcet_path: \"/x\"\n");
  auto config = LoadDaemonConfigFile(path);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("sokcet_path"), std::string::npos) << config.status();
  EXPECT_EQ(LoadDaemonConfigFile("/nonexistent/strata.textpb").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace strata
