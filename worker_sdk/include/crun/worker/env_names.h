// The worker environment contract: the variable names crun sets for every worker (the same
// names torchrun uses, so stock PyTorch programs work unchanged). The agent writes them in
// one place (agent/workers/worker_env.cc); the worker SDK reads them in one place. Header-only, no
// dependencies: GPU machines build the SDK with nothing else. docs/environment.md.
#pragma once

namespace crun::env {

inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kRank[] = "RANK";
inline constexpr char kGroupRank[] = "GROUP_RANK";
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr char kNcclAsyncErrorHandling[] = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
inline constexpr char kNcclAsyncErrorHandlingOld[] = "NCCL_ASYNC_ERROR_HANDLING";  // 1.13 name
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";
inline constexpr char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";
// crun's own additions.
inline constexpr char kCrunAttempt[] = "CRUN_ATTEMPT";         // 0, 1, ... (restarts of the group)
inline constexpr char kCrunLogDir[] = "CRUN_ATTEMPT_LOG_DIR";  // this worker's log directory
// Read by the SDK, set by users: 0 keeps Gloo groups on TCP between ranks of one host.
inline constexpr char kCrunGlooShm[] = "CRUN_GLOO_SHM";
// Hang detection (docs/hangs.md). A worker writes anything to this descriptor to say "I made
// progress" (crun::worker::Heartbeat does, once per call); absent when crun does not watch.
inline constexpr char kCrunHeartbeatFd[] = "CRUN_HEARTBEAT_FD";
// For the Python hook crun installs (sitecustomize): the descriptor the worker writes every
// thread's Python stack (faulthandler) to, which crun reads; the signal answered at the main
// thread's next safe point (a Python-level handler); the signal answered at once, from the
// signal handler (for a main thread blocked in C code, which never reaches a safe point).
inline constexpr char kCrunStacksFd[] = "CRUN_STACKS_FD";
inline constexpr char kCrunStacksSafeSignal[] = "CRUN_STACKS_SAFE_SIGNAL";
inline constexpr char kCrunStacksSignal[] = "CRUN_STACKS_SIGNAL";
// The node's snapshot store (docs/checkpoints.md): the abstract Unix socket (its leading NUL
// written '@') where crun hands out the shared memory that snapshots are saved to; absent with
// --snapshots off.
inline constexpr char kCrunSnapshotSocket[] = "CRUN_SNAPSHOT_SOCKET";
// "1" when a save returns only once crun has sealed the snapshot and copied it to another node
// (a job of several nodes, docs/checkpoints.md "On a peer"); absent otherwise.
inline constexpr char kCrunSnapshotCommit[] = "CRUN_SNAPSHOT_COMMIT";
// torchelastic's file timer: the named pipe workers' FileTimerClient writes requests to.
inline constexpr char kTimerFile[] = "TORCHELASTIC_TIMER_FILE";

}  // namespace crun::env
