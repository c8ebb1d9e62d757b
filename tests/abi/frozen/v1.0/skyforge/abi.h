/*
 * skyforge plugin ABI — the one stable contract between the host and a plugin .so.
 *
 * Pure C: no STL, no Boost, no exceptions cross this boundary. Rules (docs/plugins.md):
 *  - each plugin exports exactly one symbol, SKYFORGE_ENTRY_SYMBOL, of type sf_entry_fn;
 *  - semver: the host refuses a different major, or a plugin minor above its own;
 *  - structs only ever grow at the end; every reader honours `struct_size`;
 *  - errors cross as an sf_status plus a message the plugin owns until its next call
 *    (descriptor->last_error);
 *  - whoever allocates frees: data flows out of a call through an sf_sink, which copies;
 *  - the host never dlclose()s a plugin while the process lives.
 *
 * Any change to this file must move SKYFORGE_ABI_MINOR (additions) or SKYFORGE_ABI_MAJOR
 * (anything else); tests/abi checks the header's hash against the version.
 */
#ifndef SKYFORGE_ABI_H
#define SKYFORGE_ABI_H

#include <stddef.h>
#include <stdint.h>

#define SKYFORGE_ABI_MAJOR 1
#define SKYFORGE_ABI_MINOR 0
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

/* ---- what a node knows about itself (docs/runtime-api.md) ---------------------------------- */
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
  uint32_t slot;             /* calling slot (tasks), 0 otherwise */
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

/* ---- services the host lends to every plugin ---------------------------------------- */
typedef struct sf_host_services {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  void* ctx;
  void (*log)(void* ctx, int32_t level, const char* message);
  /* This node's identity; NULL on the client, before a pool exists. */
  const sf_instance_info* (*instance_info)(void* ctx);
  /* Rendezvous key-value store on the head node (nodes only; SF_ERR_UNSUPPORTED on the client). */
  sf_status (*kv_set)(void* ctx, const char* key, const char* value, size_t size);
  /* Waits up to timeout_ms for the key to exist, then writes its value to `out`. */
  sf_status (*kv_get)(void* ctx, const char* key, int64_t timeout_ms, sf_sink out);
  /* Atomic add on an integer key (created at 0); writes the new value to *result. */
  sf_status (*kv_add)(void* ctx, const char* key, int64_t delta, int64_t* result);
  /* Job-level configuration value by dotted key ("job.timeout"); NULL when absent. */
  const char* (*config)(void* ctx, const char* key);
  /* Message of the last failed service call on this thread. */
  const char* (*last_error)(void* ctx);
} sf_host_services;

/* ---- framework plugins (docs/plugins.md) ----------------------------------------------- */
/* Lets transform_image add to the node image. */
typedef struct sf_image_editor {
  void* ctx;
  void (*add_apt)(void* ctx, const char* package);
  void (*add_pip)(void* ctx, const char* requirement);
  void (*set_env)(void* ctx, const char* key, const char* value);
  void (*add_file)(void* ctx, const char* source, const char* destination);
} sf_image_editor;

/* The environment a node's app or command will see. */
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

/* ---- providers (docs/providers.md) ------------------------------------------------------- */
typedef struct sf_pool_spec {
  uint32_t struct_size;
  uint32_t nodes;
  uint32_t concurrency;
  const char* accelerator;
  const char* pool_id;
} sf_pool_spec;

/* Filled by provision(): one add_node per node, in node order. */
typedef struct sf_node_sink {
  void* ctx;
  /* id: provider's handle; address: the node's address as seen by other nodes */
  void (*add_node)(void* ctx, const char* id, const char* address);
  /* Address on this (client) machine that nodes reach the control plane at. */
  void (*set_control_address)(void* ctx, const char* address);
} sf_node_sink;

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
} sf_provider_hooks;

/* ---- native apps (docs/plugins.md) ---------------------------------------------------- */
typedef struct sf_app_hooks {
  uint32_t struct_size;
  /* broadcast / single: run once on this node; the result goes to `result` */
  sf_status (*run)(void* self, sf_sink result);
  /* map: one task; input bytes in, output bytes to `result` */
  sf_status (*task)(void* self, const char* input, size_t input_size, uint32_t slot, sf_sink result);
} sf_app_hooks;

/* ---- the descriptor every plugin returns --------------------------------------------- */
typedef struct sf_plugin_descriptor {
  uint32_t struct_size;
  uint16_t abi_major; /* the ABI the plugin was compiled against */
  uint16_t abi_minor;
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
  /* sf_framework_hooks / sf_provider_hooks / sf_app_hooks, by kind; first field struct_size */
  const void* hooks;
} sf_plugin_descriptor;

/* The single exported entry. Returns NULL only when the plugin cannot serve this host. */
typedef const sf_plugin_descriptor* (*sf_entry_fn)(const sf_host_services* host, uint16_t host_abi_major,
                                                   uint16_t host_abi_minor);

#ifdef __cplusplus
}
#endif

#endif /* SKYFORGE_ABI_H */
