/*
 * skyforge plugin ABI — the one stable contract between the host and a plugin .so.
 * docs/plugins.md explains it with examples; this header is the reference.
 *
 * Pure C: no STL, no Boost, no exceptions cross this boundary. Rules:
 *  - each plugin exports exactly one symbol, SKYFORGE_ENTRY_SYMBOL, of type sf_entry_fn;
 *  - semver: the host refuses a different major, or a plugin minor above its own;
 *  - structs only ever grow at the end; every reader honours `struct_size`, and a hook that
 *    lies past a table's struct_size is absent;
 *  - errors cross as an sf_status plus a message the plugin owns until its next call
 *    (descriptor->last_error);
 *  - whoever allocates frees: data flows out of a call through an sf_sink, which copies;
 *  - the host never dlclose()s a plugin while the process lives.
 *
 * Ownership and lifetimes, unless a declaration below says otherwise:
 *  - BORROWED: every pointer an argument carries (strings, sf_kv arrays, sf_argv, specs,
 *    sf_instance_info, sf_cluster, the sf_env / sf_image_editor / sf_sink / sf_node_sink
 *    tables) is the caller's and valid only until the call returns: copy what you keep;
 *  - SINKS: the receiver of an sf_sink write copies the bytes before `write` returns;
 *  - HOST-OWNED: what a host service returns (instance_info, config, communicator,
 *    compute_backend, last_error) stays the host's; its lifetime is stated at the service;
 *  - PLUGIN-OWNED: the descriptor and its hooks table live as long as the library (static
 *    storage); an instance lives from create() to destroy(); last_error strings until the
 *    plugin's next call on that thread.
 *
 * Threads: the host calls one plugin instance's hooks from one thread at a time, in the order
 * of a run (docs/architecture.md), except where a hook table says which hooks may run
 * concurrently (provider: bootstrap per node, terminate, cancel, worker_alive and worker_exit beside anything;
 * app: task, one thread per slot; compute backend: probe beside anything; a task backend's
 * hooks come from the client's threads, one at a time). Services may be called from any thread. Callbacks the host
 * lends (sinks, sf_env, sf_image_editor, sf_node_sink, services) never unwind into the
 * plugin: they return normally, and report failures through their status or last_error.
 *
 * Any change to this file's code must move SKYFORGE_ABI_MINOR (additions) or
 * SKYFORGE_ABI_MAJOR (anything else); tests/abi hashes the header without its comments and
 * checks the hash against the version, so comments may be edited freely.
 */
#ifndef SKYFORGE_ABI_H
#define SKYFORGE_ABI_H

#include <stddef.h>
#include <stdint.h>

#define SKYFORGE_ABI_MAJOR 1
#define SKYFORGE_ABI_MINOR 9
#define SKYFORGE_ENTRY_SYMBOL "skyforge_plugin_entry"

#if defined(__GNUC__) || defined(__clang__)
#define SKYFORGE_EXPORT __attribute__((visibility("default")))
#else
#define SKYFORGE_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------ */
typedef int32_t sf_status;
#define SF_OK 0
#define SF_ERR 1             /* generic failure; see last_error */
#define SF_ERR_INVALID 2     /* bad argument or option */
#define SF_ERR_UNSUPPORTED 3 /* hook cannot serve this request */
#define SF_ERR_TIMEOUT 4
#define SF_ERR_CANCELLED 5
#define SF_ERR_GONE 6 /* ABI 1.7: the node's machine or session is gone (start_worker); see replace_node */

/* ---- plugin kinds ------------------------------------------------------------------ */
typedef int32_t sf_kind;
#define SF_KIND_FRAMEWORK 1
#define SF_KIND_PROVIDER 2
#define SF_KIND_TASK_BACKEND 3
#define SF_KIND_COMPUTE_BACKEND 4
#define SF_KIND_APP 5

/* log levels */
#define SF_LOG_DEBUG 0
#define SF_LOG_INFO 1
#define SF_LOG_WARN 2
#define SF_LOG_ERROR 3
/* ABI 1.6: a transient status ("aws [12 s]: node 0 running, node 1 pending"). On a terminal the
 * host shows the latest one as a single line below all other output, replaced by the next; not
 * on a terminal, it is not shown: say what must stay in INFO lines too. On a node, the latest
 * one is where that node is ("epoch 3/6, step 412/900"): sent to the host with the node's
 * heartbeat and quoted when the node is lost or lags in a collective. Send it only to a host
 * of 1.6 or later (services abi_minor); an older one prints it as a line. */
#define SF_LOG_STATUS 4

/* ---- small value types ------------------------------------------------------------- */
/* A borrowed key/value pair: valid for the duration of the call that passes it. */
typedef struct sf_kv {
  const char* key;
  const char* value;
} sf_kv;

/* Where a callee writes bytes it produces. The receiver copies; the writer keeps ownership
 * of its buffer. `write` may be called several times; chunks are concatenated. */
typedef struct sf_sink {
  void* ctx;
  void (*write)(void* ctx, const char* data, size_t size);
} sf_sink;

/* ---- what a node knows about itself (docs/runtime-api.md) --------------------------- */
typedef struct sf_instance_info {
  uint32_t struct_size;
  uint32_t node;             /* 0..total_nodes-1; node 0 is the head */
  uint32_t total_nodes;
  uint32_t is_head;          /* 1 on node 0 */
  const char* head_addr;     /* address of the head node, reachable from every node */
  const char* private_ip;    /* this node's own address */
  uint32_t local_rank;       /* rank of this worker among workers on its machine */
  uint32_t local_world_size; /* workers on this machine */
  uint32_t accelerators;     /* accelerators on this node (0: CPU only) */
  const char* accelerator;   /* accelerator spec from the manifest, "" for none */
  uint32_t concurrency;      /* task slots on this node */
  uint32_t slot;             /* the calling task's slot: instance_info() called on a map job's
                                task thread returns that slot's record; 0 elsewhere */
  const char* pool_id;       /* unique per pool */
  const char* store_addr;    /* host:port of the head's rendezvous store */
  const char* work_dir;      /* this node's working directory */
} sf_instance_info;

/* What the client knows about the pool before it starts. */
typedef struct sf_cluster {
  uint32_t struct_size;
  uint32_t total_nodes;
  uint32_t concurrency;
  const char* accelerator;
  const char* provider;
  const char* pool_id;
} sf_cluster;

/* ---- collectives across the pool's nodes (docs/runtime-api.md; ABI 1.1) -------------- */
typedef int32_t sf_dtype;
#define SF_DTYPE_F32 1
#define SF_DTYPE_F64 2
#define SF_DTYPE_I32 3
#define SF_DTYPE_I64 4

typedef int32_t sf_reduce_op;
#define SF_REDUCE_SUM 1
#define SF_REDUCE_MAX 2
#define SF_REDUCE_MIN 3

/* One process group over every node of the pool (rank = node). Calls are collective: every
 * rank makes the same calls in the same order. Results are identical, bit for bit, on every
 * rank. Buffers are the caller's; nothing is retained after a call returns. */
typedef struct sf_communicator {
  uint32_t struct_size;
  void* ctx;
  uint32_t rank;
  uint32_t size;
  /* In place: data[i] = op over ranks of data[i]. */
  sf_status (*allreduce)(void* ctx, void* data, size_t count, sf_dtype dtype, sf_reduce_op op);
  /* In place: every rank's `bytes` bytes become root's. */
  sf_status (*broadcast)(void* ctx, void* data, size_t bytes, uint32_t root);
  /* out (size * bytes) = rank 0's `in`, then rank 1's, ... */
  sf_status (*allgather)(void* ctx, const void* in, size_t bytes, void* out);
  sf_status (*barrier)(void* ctx);
  /* Message of the last failed call on this thread. */
  const char* (*last_error)(void* ctx);
} sf_communicator;

/* ---- services the host lends to every plugin ---------------------------------------- */
struct sf_compute_hooks; /* defined below, with the compute backends */

/* Lent to every plugin at entry and create(); valid for the life of the process. Every service
 * may be called from any thread, never throws, and reports a failure as a status (or NULL)
 * with the reason in last_error(). */
typedef struct sf_host_services {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  void* ctx;
  /* SF_LOG_*; the message is copied. INFO, WARN and ERROR are shown to the user; DEBUG only
   * with `skyforge run -v`. */
  void (*log)(void* ctx, int32_t level, const char* message);
  /* This node's identity; NULL on the client, before a pool exists. Host-owned, unchanging,
   * valid for the life of the process. */
  const sf_instance_info* (*instance_info)(void* ctx);
  /* Rendezvous key-value store on the head node (nodes only; SF_ERR_UNSUPPORTED on the client). */
  sf_status (*kv_set)(void* ctx, const char* key, const char* value, size_t size);
  /* Waits up to timeout_ms for the key to exist, then writes its value to `out`. */
  sf_status (*kv_get)(void* ctx, const char* key, int64_t timeout_ms, sf_sink out);
  /* Atomic add on an integer key (created at 0); writes the new value to *result. */
  sf_status (*kv_add)(void* ctx, const char* key, int64_t delta, int64_t* result);
  /* Job-level configuration value by dotted key ("job.timeout"); NULL when absent. Host-owned,
   * valid for the life of the process (the job's configuration never changes once set). */
  const char* (*config)(void* ctx, const char* key);
  /* Message of the last failed service call on this thread; valid until the next service
   * call on this thread. */
  const char* (*last_error)(void* ctx);
  /* ABI 1.1 (check struct_size before use) ------------------------------------------------ */
  /* The pool's communicator (rank = node), created on first use by a collective rendezvous of
   * every node; NULL on the client or when it cannot be built (last_error says why).
   * Host-owned; valid until the calling plugin is destroyed (the host keeps it until every
   * app, framework and compute backend instance on the node is gone). */
  const sf_communicator* (*communicator)(void* ctx);
  /* A compute backend loaded on this node: `name` as in the manifest, or NULL/"" for the one
   * the manifest selected (the keras plugin's `backend`). Host-owned: *hooks and *self stay
   * valid until the calling plugin is destroyed (compute backends outlive apps); never
   * destroy them. */
  sf_status (*compute_backend)(void* ctx, const char* name, const struct sf_compute_hooks** hooks,
                               void** self);
} sf_host_services;

/* ---- framework plugins (docs/plugins.md) --------------------------------------------- */
/* Lets transform_image add to the node image. Borrowed for that call; arguments are copied. */
typedef struct sf_image_editor {
  void* ctx;
  void (*add_apt)(void* ctx, const char* package);
  void (*add_pip)(void* ctx, const char* requirement);
  void (*set_env)(void* ctx, const char* key, const char* value);
  void (*add_file)(void* ctx, const char* source, const char* destination);
} sf_image_editor;

/* The environment a node's app or command will see. Borrowed for the call that passes it;
 * `set` copies; `get`'s result is valid until the next `set` or the end of that call. */
typedef struct sf_env {
  void* ctx;
  void (*set)(void* ctx, const char* key, const char* value);
  const char* (*get)(void* ctx, const char* key); /* NULL when unset */
} sf_env;

/* A command line: argc strings. */
typedef struct sf_argv {
  size_t argc;
  const char* const* argv;
} sf_argv;

/* Every hook is optional (NULL: nothing to do). Client hooks run on the client's main thread,
 * node hooks on the worker's main thread, one at a time; around_*_enter runs in manifest order
 * and around_*_exit in reverse, also after a failure: app_status is not SF_OK when the node's
 * app or command failed or, in a map job, any of the node's tasks did; a failing
 * around_app_exit fails the node's run. */
typedef struct sf_framework_hooks {
  uint32_t struct_size;
  /* client */
  sf_status (*transform_image)(void* self, const sf_cluster* cluster, const sf_image_editor* image);
  /* client: shell lines appended to every node's bootstrap script, one per write */
  sf_status (*bootstrap)(void* self, const sf_cluster* cluster, sf_sink line);
  sf_status (*around_client_enter)(void* self, const sf_cluster* cluster);
  sf_status (*around_client_exit)(void* self, const sf_cluster* cluster, sf_status job_status);
  /* node */
  sf_status (*around_app_enter)(void* self, const sf_instance_info* info, const sf_env* env);
  sf_status (*around_app_exit)(void* self, const sf_instance_info* info, sf_status app_status);
  /* node: rewrite a command app's argv; write each output argument to `out` as one write */
  sf_status (*launcher)(void* self, const sf_instance_info* info, const sf_argv* in, sf_sink out);
} sf_framework_hooks;

/* ---- providers (docs/providers.md) -------------------------------------------------- */
typedef struct sf_pool_spec {
  uint32_t struct_size;
  uint32_t nodes;
  uint32_t concurrency;
  const char* accelerator;
  const char* pool_id;
  /* ABI 1.4 (read them only when struct_size covers them): the absolute paths of the files on
   * this machine that every node needs at the same path: skyforge-worker, the libraries of the
   * plugins the nodes load and their plugin.toml, the image's file sources. A provider whose
   * nodes share this machine's filesystem ignores them. One whose nodes do not (ssh, slurm)
   * copies them and runs the bootstrap and the worker with SKYFORGE_STAGE_ROOT set to a directory
   * that holds each of them under its absolute path: the worker loads a plugin from
   * $SKYFORGE_STAGE_ROOT/<path> when that exists, the bootstrap copies image files from there. */
  const char* const* stage_files;
  size_t n_stage_files;
} sf_pool_spec;

/* Filled by provision(): one add_node per node, in node order. */
typedef struct sf_node_sink {
  void* ctx;
  /* id: provider's handle; address: the node's address as seen by other nodes */
  void (*add_node)(void* ctx, const char* id, const char* address);
  /* Address on this (client) machine that nodes reach the control plane at. */
  void (*set_control_address)(void* ctx, const char* address);
} sf_node_sink;

/* How a node's worker ended (ABI 1.2), filled by a provider's worker_exit. The host owns the
 * struct; the provider writes into it. */
typedef struct sf_worker_exit {
  uint32_t struct_size;
  int32_t exit_code;      /* the worker's exit status; -1 when a signal ended it */
  int32_t signal;         /* the signal that ended it (SIGSEGV, SIGKILL, ...); 0 when it exited */
  char last_words[512];   /* NUL-terminated: the last line the worker wrote to its stderr, when
                             the provider kept it (a worker killed by a fatal signal writes which
                             task of which app it was running); "" otherwise */
} sf_worker_exit;

/* The four marked hooks are required (the host refuses a provider without them at load).
 * provision and start_worker run on the host's main thread; bootstrap runs concurrently, one
 * thread per node; terminate may run at any time beside any other hook — from the signal path
 * on a second Ctrl-C, or after a partial provision — and worker_alive / worker_exit from the
 * host's threads while nodes run: all three must be thread-safe. */
typedef struct sf_provider_hooks {
  uint32_t struct_size;
  sf_status (*provision)(void* self, const sf_pool_spec* spec, const sf_node_sink* out);            /* required */
  /* Run the bootstrap script on the node; output lines go to `log`. */
  sf_status (*bootstrap)(void* self, const char* node_id, const char* script, sf_sink log);        /* required */
  /* Start the worker; `env` holds variables the worker needs (secret included: keep it off argv). */
  sf_status (*start_worker)(void* self, const char* node_id, const sf_argv* cmd, const sf_kv* env,
                            size_t n_env);                                                         /* required */
  /* Tear down every listed node; must be idempotent and safe after partial provisioning. */
  sf_status (*terminate)(void* self, const char* const* node_ids, size_t n);                       /* required */
  /* 1 while the node's worker is alive, 0 once it is gone, <0 when unknown. Optional. */
  int32_t (*worker_alive)(void* self, const char* node_id);
  /* ABI 1.2. Optional. How the node's worker ended: 1 with *out filled once it has ended, 0
   * while it runs, <0 when the provider cannot tell. Must not block. The host asks when a node's
   * connection drops before its result, to say why (signal, exit status, last words). */
  int32_t (*worker_exit)(void* self, const char* node_id, sf_worker_exit* out);
  /* ABI 1.6. Optional. Stop waiting: a provision() running on another thread returns, with an
   * error, as soon as it can instead of finishing (a machine still booting, a job still queued).
   * Called from the host's signal thread on the first Ctrl-C / SIGTERM, beside provision();
   * must not block; terminate() follows as usual. */
  void (*cancel)(void* self);
  /* ABI 1.6. Optional. `skyforge sweep --provider NAME`: find what this provider made for pools
   * that are gone (by its own marks: tags, names, expiry), and with terminate != 0 tear it down.
   * One line per thing found to `report`, each ending in '\n' (what it is, why it is left over,
   * what was done).
   * Runs on the client with no pool; may take as long as the teardown takes. */
  sf_status (*reconcile)(void* self, int32_t terminate, sf_sink report);
  /* ABI 1.6. Optional. `skyforge offers --provider NAME`: the machine types this provider can
   * make that fit `accelerator` (a [pool] accelerator spec, "A100:1"; "" for all), cheapest
   * first, as text for a terminal, to `out`. Runs on the client with no pool. */
  sf_status (*offers)(void* self, const char* accelerator, sf_sink out);
  /* ABI 1.7. Optional. Node `node_id`'s machine is gone (start_worker returned SF_ERR_GONE: its
   * session ended, a host down, its sshd killed, a spot instance reclaimed), so no worker can
   * start there again: give the node
   * another machine under the same id (a spare host, a new instance) and write its address to
   * `address`. The host then bootstraps it again and starts its worker there ([job]
   * max_restarts). SF_ERR_UNSUPPORTED when there is no spare capacity (say what would give some).
   * Called from the host's main thread, never beside provision(). */
  sf_status (*replace_node)(void* self, const char* node_id, sf_sink address);
} sf_provider_hooks;

/* ---- native apps (docs/plugins.md) --------------------------------------------------- */
/* run is required for mode = "broadcast" | "single", task for mode = "map" (checked when a job
 * names the app). run executes on the worker's main thread; task runs concurrently on
 * `concurrency` threads, one per slot, each slot's tasks one after another. */
typedef struct sf_app_hooks {
  uint32_t struct_size;
  /* broadcast / single: run once on this node; the result goes to `result` */
  sf_status (*run)(void* self, sf_sink result);
  /* map: one task; input bytes in, output bytes to `result` */
  sf_status (*task)(void* self, const char* input, size_t input_size, uint32_t slot, sf_sink result);
} sf_app_hooks;

/* ---- compute backends (docs/compute-backends.md; ABI 1.1, probe 1.3) ---------------- */
/* An engine owns a whole training step (forward, backward, gradient allreduce, optimizer
 * update), so a backend is free to fuse and overlap. Tensors are float32, row-major, images
 * NHWC; labels int32 class indices. */
typedef struct sf_layer_spec {
  const char* type;     /* "dense", "conv2d", "batch_normalization", "relu", "softmax",
                           "dropout", "flatten", "global_average_pooling2d", "max_pooling2d" */
  const sf_kv* options; /* e.g. units=128, activation=relu; text values */
  size_t n_options;
} sf_layer_spec;

typedef struct sf_model_spec {
  uint32_t struct_size;
  const uint32_t* input_shape; /* one sample's shape, e.g. {28, 28, 1} */
  uint32_t input_rank;
  const sf_layer_spec* layers;
  size_t n_layers;
  const char* optimizer; /* "sgd" | "adam" */
  const sf_kv* optimizer_options; /* learning_rate, momentum, beta_1, beta_2, epsilon, nesterov */
  size_t n_optimizer_options;
  const char* loss;      /* "sparse_categorical_crossentropy" (from logits) */
  uint64_t seed;         /* initial weights, dropout masks */
  uint32_t threads;      /* 0: every core this process may use */
} sf_model_spec;

typedef struct sf_step_result {
  uint32_t struct_size;
  double loss;       /* mean over the global batch (every rank's samples) */
  uint64_t correct;  /* correctly classified samples in the global batch */
  uint64_t samples;  /* samples in the global batch */
} sf_step_result;

/* Every hook but probe is required (the host refuses a compute backend without them at load).
 * One engine's hooks are called from one thread at a time; engines of one backend may be used
 * from different threads. */
typedef struct sf_compute_hooks {
  uint32_t struct_size;
  /* comm may be NULL (one replica). With comm->size > 1 the engine is data-parallel: rank 0's
   * initial weights are broadcast, gradients are averaged over the global batch every step. */
  sf_status (*engine_create)(void* self, const sf_model_spec* spec, const sf_communicator* comm,
                             void** engine);
  void (*engine_destroy)(void* self, void* engine);
  /* Message of the engine's last failure, owned by the engine until its next call. */
  const char* (*engine_last_error)(void* self, void* engine);
  /* Collective when data-parallel: every rank calls it once per step (batch may differ, > 0). */
  sf_status (*train_step)(void* self, void* engine, const float* x, const int32_t* y, uint32_t batch,
                          sf_step_result* out);
  /* Inference mode; collective like train_step (the result covers every rank's batch). */
  sf_status (*eval_step)(void* self, void* engine, const float* x, const int32_t* y, uint32_t batch,
                         sf_step_result* out);
  /* Local only: batch x classes logits into `logits`. */
  sf_status (*predict)(void* self, void* engine, const float* x, uint32_t batch, float* logits);
  /* Trainable parameters, flattened in layer order. */
  sf_status (*param_count)(void* self, void* engine, uint64_t* count);
  sf_status (*get_params)(void* self, void* engine, float* out, uint64_t count);
  sf_status (*set_params)(void* self, void* engine, const float* in, uint64_t count);
  /* Everything training needs to resume (parameters, optimizer slots, moving statistics,
   * step), as opaque bytes the same backend reads back with load_state. */
  sf_status (*state_dict)(void* self, void* engine, sf_sink out);
  sf_status (*load_state)(void* self, void* engine, const char* data, size_t size);
  /* ABI 1.3. Optional. Whether an engine can run in this process: SF_OK, or
   * SF_ERR_UNSUPPORTED with last_error(self) naming what is missing (no driver, no device, a
   * device the backend was not built for). Cheap and side-effect free; thread-safe. The client
   * calls it before it provisions a pool whose nodes are processes on its own machine (the
   * `local` provider), so such a run stops before anything starts; every node calls it for the
   * selected backend before its app or command runs, after the framework plugins'
   * around_app_enter (they may choose the devices: CUDA_VISIBLE_DEVICES). */
  sf_status (*probe)(void* self);
  /* ABI 1.8. Optional, all five or none (the host refuses a table with some of them). Bound
   * data: the engine keeps a dataset (a GPU engine in device memory) and a step names its
   * samples by index, so a fit copies its data once instead of once per step and the batch is
   * gathered where the engine runs. bind_data copies n samples (x: n times one sample's floats;
   * y: n labels, each checked here) and writes the set's handle to *data. SF_ERR_UNSUPPORTED
   * when this engine keeps no data or the set does not fit: the caller passes samples to
   * train_step / eval_step instead. A handle is valid until release_data or engine_destroy. */
  sf_status (*bind_data)(void* self, void* engine, const float* x, const int32_t* y, uint64_t n, uint64_t* data);
  sf_status (*release_data)(void* self, void* engine, uint64_t data);
  /* train_step / eval_step on samples idx[0 .. batch) of bound set `data` (each index < its n;
   * repeats allowed); collective like them. out NULL: deferred: the step's result is not
   * returned but added to the engine's pending sums, and the call need not wait for the step
   * (a GPU engine runs ahead of the host); take_results hands the sums over. */
  sf_status (*train_step_indexed)(void* self, void* engine, uint64_t data, const uint64_t* idx, uint32_t batch,
                                  sf_step_result* out);
  sf_status (*eval_step_indexed)(void* self, void* engine, uint64_t data, const uint64_t* idx, uint32_t batch,
                                 sf_step_result* out);
  /* The pending sums of every deferred step since the last take (loss: the mean over their
   * samples; correct and samples: totals; all 0 when none), which then start again from zero.
   * Waits for those steps; local (each rank's sums already cover the global batches). */
  sf_status (*take_results)(void* self, void* engine, sf_step_result* out);
  /* ABI 1.9. Optional. Every rank's batch for the next train_step_indexed or eval_step_indexed
   * (batches[r]: rank r's, `ranks` of them, the pool's size), from a schedule every rank knows
   * alike (keras' fit: the global batch's shares, each rank's part size gathered once): the
   * caller passes the same array on every rank. A GPU engine that captures steps as graphs
   * then chooses the step's graph from it, without exchanging its choice with its peers each
   * step; without it, it does that exchange (a few bytes, collective). It applies to the next
   * indexed step only. SF_ERR_INVALID when ranks is not the pool's size or a batch is 0; an
   * engine that uses it fails the step when batches[rank] is not its batch. Engines without
   * graphs (or with them off) ignore it. */
  sf_status (*step_batches)(void* self, void* engine, const uint32_t* batches, uint32_t ranks);
} sf_compute_hooks;

/* ---- task backends (docs/plugins.md; ABI 1.5) ----------------------------------------- */
/* A task backend is a map job's policy ([job] mode = "map"; [tasks] backend = "<name>", its
 * options the rest of [tasks]). The client creates one per run and asks it everything a
 * scheduler decides: which tasks there are (plan, optional), which go to which node in which
 * batches and in what order (next_batch), what a failed task or a lost node means (completed,
 * node_lost, state), and what the run prints at the end (report, optional). The host moves the
 * bytes: it sends each batch to its node, where the app's `task` hook runs it on the node's
 * slots, and hands every answer back. The last answer the host received for a task is that
 * task's result. The hooks are called from the client's threads, one call at a time; none may
 * block (the control plane waits on them). */
typedef struct sf_task_job {
  uint32_t struct_size;
  uint32_t nodes;          /* nodes in the pool, numbered 0..nodes-1 */
  uint32_t slots_per_node; /* [pool] concurrency (>= 1): tasks a node runs at once */
  uint32_t pipeline;       /* batches per slot a node may hold: the host never has more than
                              slots_per_node * pipeline of a node's batches unanswered (running
                              or queued: the node's free slots take them from one queue, in
                              order), and does not call next_batch for a node that holds that
                              many. A backend may stay under it (more queued = less idle, worse
                              tail) */
  uint64_t n_tasks;        /* the job's tasks, indexed 0..n_tasks-1 (plan's count when it made them) */
  const char* app;         /* the app that runs the tasks */
} sf_task_job;

/* One task's answer. BORROWED, like every argument. */
typedef struct sf_task_outcome {
  uint64_t task;     /* its index */
  uint32_t node;     /* where it ran */
  uint32_t slot;     /* the node's slot that ran it */
  int32_t ok;        /* 1: value is its result; 0: value is its error message */
  const char* value;
  size_t size;
} sf_task_outcome;

/* state() */
#define SF_TASKS_RUNNING 0 /* answers still to come: the host keeps asking next_batch */
#define SF_TASKS_DONE 1    /* every task has its final answer */
#define SF_TASKS_FAILED 2  /* the job failed; the run stops, cancelling what is queued */

/* Every hook but plan and report is required (the host refuses a task backend without them at
 * load). */
typedef struct sf_task_hooks {
  uint32_t struct_size;
  /* Optional. Called once, before begin: the job's task inputs when the backend makes them
   * (one write to `inputs` per task, in index order; `manifest_inputs` are the manifest's own,
   * `tasks = N` giving "0".."N-1", possibly none). Absent, or no write: the manifest's. */
  sf_status (*plan)(void* self, const char* const* manifest_inputs, size_t n, sf_sink inputs);
  /* Called once: the job starts, with its final task count. */
  sf_status (*begin)(void* self, const sf_task_job* job);
  /* The next batch for `node`: up to `cap` task indices written to `tasks`, their count to *n
   * (0: nothing for this node now). The host asks whenever the node may take work (it became
   * ready, answered a batch, or another node was lost), until the answer is 0. A task may be
   * handed out again only after its last batch was answered or its node lost. */
  sf_status (*next_batch)(void* self, uint32_t node, uint64_t* tasks, size_t cap, size_t* n);
  /* The answers to one batch of `node`, in the order its tasks were handed out; `elapsed_ns`:
   * the node's time on the whole batch (for sizing the next ones). */
  sf_status (*completed)(void* self, uint32_t node, const sf_task_outcome* outcomes, size_t n,
                         uint64_t elapsed_ns);
  /* `node` is gone: the tasks it held without answering are the backend's to hand out again
   * (next_batch, to other nodes) or to fail the job with (state). It is never asked again. */
  sf_status (*node_lost)(void* self, uint32_t node);
  /* Where the job stands: SF_TASKS_RUNNING / DONE / FAILED. With FAILED, `why` gets one write
   * naming the task, its node and slot, and the cause. */
  int32_t (*state)(void* self, sf_sink why);
  /* Optional. After a job that ended DONE: what the run prints instead of its line per task
   * (`results`: each task's final answer, by index), one write per line. */
  sf_status (*report)(void* self, const sf_task_outcome* results, size_t n, sf_sink out);
} sf_task_hooks;

/* ---- the descriptor every plugin returns --------------------------------------------- */
/* Returned by the entry; static storage, valid as long as the library. name, create, destroy,
 * last_error and hooks are required (hooks: the table of `kind`). */
typedef struct sf_plugin_descriptor {
  uint32_t struct_size;
  uint16_t abi_major; /* the ABI the plugin needs: the host's major must be the same... */
  uint16_t abi_minor; /* ...and its minor at least this (a plugin that uses no 1.1 member may
                         say 0 and load in a 1.0 host; see SKYFORGE_PLUGIN_ABI_MINOR in sdk.hpp) */
  sf_kind kind;
  const char* name;
  const char* version;
  const char* description;
  /* Create an instance with validated options. On failure *self is untouched and
   * last_error(NULL) says why. */
  sf_status (*create)(const sf_host_services* host, const sf_kv* options, size_t n_options, void** self);
  void (*destroy)(void* self);
  /* Message for the last failure of `self` (NULL self: of create). Owned by the plugin,
   * valid until the plugin's next call on the same thread. */
  const char* (*last_error)(void* self);
  /* sf_framework_hooks / sf_provider_hooks / sf_app_hooks / sf_compute_hooks / sf_task_hooks
   * (ABI 1.5), by kind; first field struct_size */
  const void* hooks;
} sf_plugin_descriptor;

/* The single exported entry. Returns NULL only when the plugin cannot serve this host. */
typedef const sf_plugin_descriptor* (*sf_entry_fn)(const sf_host_services* host, uint16_t host_abi_major,
                                                   uint16_t host_abi_minor);

#ifdef __cplusplus
}
#endif

#endif /* SKYFORGE_ABI_H */
