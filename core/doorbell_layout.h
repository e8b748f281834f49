// The doorbell: a small shared-memory page per rank that carries the
// per-bucket signals (gradient-ready, trainer -> daemon; step-done, daemon ->
// trainer) without a gRPC round trip. gRPC stays for control (attach, create,
// errors, checkpoints) and is the fallback whenever the doorbell cannot say
// something (docs/DAEMON.md, "The doorbell").
//
// This header is the wire format both sides map (a sealed memfd the daemon
// creates and hands over the fd socket, with an eventfd the trainer writes to
// wake the daemon), plus the futex calls both use. The daemon side is
// daemon/doorbell.h; the client side is in client/strata_client.cc.
//
//   trainer                                      daemon (one poller thread)
//   entries[tail % cap] = {index, step}
//   tail.store(tail + 1, seq_cst)
//   write(eventfd, 1) unless polling  ───────►   epoll wakes; drains entries
//                                                [private head, tail) through
//                                                Job::GradReady; head.store();
//   futex_wait(epoch) until head/steps ◄──────   epoch++ ; futex_wake(epoch)
//
// Everything the trainer can write (tail, the entries, and anything else in
// the page: it is mapped writable) is untrusted by the daemon, which keeps
// its own head and reads each field exactly once.
#ifndef STRATA_CORE_DOORBELL_LAYOUT_H_
#define STRATA_CORE_DOORBELL_LAYOUT_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace strata::doorbell {

inline constexpr uint32_t kMagic = 0x4C424453;  // "SDBL"
inline constexpr uint32_t kVersion = 2;  // 2: the gradient window (grad_room_bytes ...)
// Entries in the ring; a power of two. A rank normally has one entry per
// sub-group in flight; a full ring makes the trainer wait for the daemon.
inline constexpr uint32_t kCapacity = 1024;
inline constexpr uint32_t kOutcomes = 8;      // step outcomes kept (step % kOutcomes)
inline constexpr uint32_t kMessageWords = 32;  // 256 bytes of error text

// Flags the daemon publishes: the trainer goes back to gRPC, which says why.
inline constexpr uint32_t kFlagClosed = 1;  // the job is stopping or gone
inline constexpr uint32_t kFlagFailed = 2;  // the job failed

struct Entry {
  std::atomic<uint64_t> index;  // shard (sub-group) index; 64 bits so a wild value cannot alias a real one
  std::atomic<uint64_t> step;
};

// A finished step, written by the daemon under a tag: 0 while it is being
// written, step + 1 once complete (read tag, fields, tag again).
struct Outcome {
  std::atomic<uint64_t> tag;
  std::atomic<uint64_t> skipped;
  std::atomic<uint64_t> loss_scale_bits;
  std::atomic<uint64_t> grad_norm_bits;
  std::atomic<uint64_t> optimizer_steps;
};

struct Shared {
  // Set once by the daemon; checked by the client when it maps the page.
  uint32_t magic;
  uint32_t version;
  uint32_t capacity;
  uint32_t reserved;
  alignas(64) std::atomic<uint64_t> tail;  // trainer: entries published
  alignas(64) std::atomic<uint64_t> head;  // daemon: entries consumed
  // The futex word: the daemon bumps it after every change below.
  std::atomic<uint32_t> epoch;
  std::atomic<uint32_t> flags;
  // Trainer threads in futex_wait on epoch; the daemon skips the wake
  // syscall when there are none (a wrong value costs a syscall or a wait
  // until the trainer's own timeout, nothing else).
  std::atomic<uint32_t> client_waiters;
  // 1 while the daemon's poller is spinning on this ring: a trainer that
  // reads it after publishing its tail may skip the eventfd write (the
  // poller clears it, then reads the tail once more, before it sleeps). Only
  // the daemon writes it and the daemon never reads it.
  std::atomic<uint32_t> daemon_polling;
  // Step the daemon accepts gradients for, plus one (0: none yet, e.g.
  // before every rank called InitParams).
  std::atomic<uint64_t> open_step_plus1;
  std::atomic<uint64_t> done_steps;  // steps finished (the job's next step)
  // The gradient window (ZeRO-Infinity): the bytes of gradient this rank may
  // have in its slots at once (0: no limit), what the daemon holds of them
  // now (taken by GradReady, not yet spilled to NVMe or stepped), and the
  // hold it promises to come down to by spilling once every signal it took is
  // inspected. A trainer waits before writing a slot until what the daemon
  // holds, plus its own signals not yet taken and slots written but not yet
  // signaled, leaves room for the slot -- or until the daemon holds no more
  // than grad_keep_bytes (then nothing more will be freed before the step:
  // writing is the only way forward). Every change bumps the epoch.
  std::atomic<uint64_t> grad_room_bytes;
  std::atomic<uint64_t> grad_keep_bytes;
  std::atomic<uint64_t> grad_held_bytes;
  // The last signal the daemon refused (a stale step, say): a sequence
  // number (odd while being written), its absl::StatusCode and message.
  std::atomic<uint64_t> error_seq;
  std::atomic<uint64_t> error_code;
  std::atomic<uint64_t> error_text[kMessageWords];
  Outcome outcomes[kOutcomes];
  alignas(64) Entry entries[kCapacity];
};

inline constexpr uint64_t kBytes = (sizeof(Shared) + 4095) / 4096 * 4096;
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the doorbell needs address-free atomics");
static_assert((kCapacity & (kCapacity - 1)) == 0);

inline void WriteText(std::atomic<uint64_t>* words, std::string_view text) {
  char buf[kMessageWords * 8] = {};
  std::memcpy(buf, text.data(), std::min(text.size(), sizeof(buf) - 1));
  for (uint32_t i = 0; i < kMessageWords; ++i) {
    uint64_t w;
    std::memcpy(&w, buf + 8 * i, 8);
    words[i].store(w, std::memory_order_relaxed);
  }
}

inline std::string ReadText(const std::atomic<uint64_t>* words) {
  char buf[kMessageWords * 8 + 1] = {};
  for (uint32_t i = 0; i < kMessageWords; ++i) {
    const uint64_t w = words[i].load(std::memory_order_relaxed);
    std::memcpy(buf + 8 * i, &w, 8);
  }
  return std::string(buf, strnlen(buf, kMessageWords * 8));
}

// Futexes on a MAP_SHARED page work across processes (no FUTEX_PRIVATE_FLAG).
// Waits while *word == expected, at most timeout_ns (spurious returns are
// fine: callers loop).
inline void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace strata::doorbell

#endif  // STRATA_CORE_DOORBELL_LAYOUT_H_
