/* strata's CUDA launch loop in C: one call of a compiled program without Python per kernel.

   Why C: a call from Python through cuda-bindings costs microseconds per driver call and per
   argument object, so a program of a hundred kernels, or a tiny one called in a loop, spent its
   time on the host (65 us per call on an H100 for a 4 us kernel). Here the host work of a call is
   writing the pointers of its inputs and outputs into the kernels' argument slots and one graph
   launch (or one cuLaunchKernel per kernel).

   A plan (st_plan) is every launch of a program: its function, grid, block, dynamic shared memory
   and parameters. A parameter is either fixed (a weight, a temp in the program's slab, a tensor
   map: its value or blob is set once) or takes one of the call's pointers (`slot`: the inputs,
   then the outputs, in the order runtime/cuda_launcher.py writes them). st_launch writes those and
   launches on the caller's stream; st_graph launches the plan as one CUDA graph. With a graph, the graph is built from the plan on the first
   such call and instantiated; a later call whose pointers differ updates only the kernel nodes
   that read a changed slot (cuGraphExecKernelNodeSetParams), so a caller's tensor is bound in
   place, never copied.

   libcuda is opened by name with dlopen (st_open), so this file needs no CUDA headers: the few
   types below are the ABI of cuda.h (CUDA 12 and 13). Tests open a stand-in library instead. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef void *CUfunction, *CUstream, *CUcontext, *CUgraph, *CUgraphExec, *CUgraphNode;

typedef struct {            /* CUgraphEdgeData */
    unsigned char from_port, to_port, type, reserved[5];
} EdgeData;
enum { PORT_PROGRAMMATIC = 1, DEPENDENCY_PROGRAMMATIC = 1 };

typedef struct {            /* CUDA_KERNEL_NODE_PARAMS_v2 */
    CUfunction func;
    unsigned grid[3], block[3], smem;
    void **params, **extra;
    void *kern;
    CUcontext ctx;
} NodeParams;

static struct {
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*graph_create)(CUgraph *, unsigned);
    CUresult (*graph_add_kernel)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                 const NodeParams *);
    CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*graph_set_kernel)(CUgraphExec, CUgraphNode, const NodeParams *);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
    CUresult (*graph_destroy)(CUgraph);
    CUresult (*exec_destroy)(CUgraphExec);
    CUresult (*graph_add_edges)(CUgraph, const CUgraphNode *, const CUgraphNode *,
                                const EdgeData *, size_t);      /* optional: CUDA 12.3+ */
} cu;

static const char *NAMES[] = {"cuCtxSetCurrent", "cuLaunchKernel", "cuGraphCreate",
                              "cuGraphAddKernelNode_v2", "cuGraphInstantiateWithFlags",
                              "cuGraphExecKernelNodeSetParams_v2", "cuGraphLaunch",
                              "cuGraphDestroy", "cuGraphExecDestroy"};

/* Open `library` (libcuda.so.1) and find every entry point: 0, or 1 + the index of the first
   missing one (st_missing_name names it), or -1 when the library does not open. */
int st_open(const char *library) {
    void *lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return -1;
    void **table = (void **)&cu;
    for (unsigned i = 0; i < sizeof NAMES / sizeof *NAMES; i++)
        if (!(table[i] = dlsym(lib, NAMES[i]))) return 1 + (int)i;
    *(void **)&cu.graph_add_edges = dlsym(lib, "cuGraphAddDependencies_v2");
    return 0;
}

/* Whether graphs can join kernels by programmatic edges (the driver has edge data). */
int st_has_programmatic_edges(void) { return cu.graph_add_edges != NULL; }

const char *st_missing_name(int i) { return NAMES[i - 1]; }

typedef struct {
    int n_kernels, n_params, n_slots, failed, programmatic;
    NodeParams *kernel;     /* per kernel; .params points into argp */
    int *first;             /* per kernel: its first parameter (n_kernels + 1 entries) */
    int *slot;              /* per parameter: -1 fixed, else the call pointer it takes */
    uint64_t *value;        /* per parameter: the pointer the kernel reads */
    void **argp;            /* per parameter: where the driver reads it (value or a blob) */
    uint64_t *bound;        /* per slot: the pointer the instantiated graph holds */
    CUcontext ctx;
    CUgraph graph;
    CUgraphExec exec;
    CUgraphNode *node;
} Plan;

/* A plan of n_kernels launches: functions, dims (grid, block, dynamic smem per kernel), first
   (n_kernels + 1 parameter offsets), and per parameter its slot (-1 fixed), its fixed value and
   the address of its blob (a 128-byte tensor map the caller keeps alive; 0: the value is passed).
   `programmatic`: its graph joins consecutive kernels by programmatic edges (every kernel waits
   for its predecessor itself: griddepcontrol.wait). NULL when out of memory. */
void *st_plan(int n_kernels, const uint64_t *functions, const uint32_t *dims, const int32_t *first,
              const int32_t *slot, const uint64_t *value, const uint64_t *blob, int n_slots,
              uint64_t ctx, int programmatic) {
    int n = first[n_kernels];
    Plan *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_kernels = n_kernels, p->n_params = n, p->n_slots = n_slots, p->failed = -1;
    p->programmatic = programmatic && cu.graph_add_edges;
    p->ctx = (CUcontext)(uintptr_t)ctx;
    p->kernel = calloc(n_kernels + 1, sizeof *p->kernel);
    p->first = malloc((n_kernels + 1) * sizeof *p->first);
    p->slot = malloc((n + 1) * sizeof *p->slot);
    p->value = calloc(n + 1, sizeof *p->value);
    p->argp = calloc(n + 1, sizeof *p->argp);
    p->bound = calloc(n_slots + 1, sizeof *p->bound);
    p->node = calloc(n_kernels + 1, sizeof *p->node);
    if (!p->kernel || !p->first || !p->slot || !p->value || !p->argp || !p->bound || !p->node) {
        free(p->kernel), free(p->first), free(p->slot), free(p->value), free(p->argp);
        free(p->bound), free(p->node), free(p);
        return NULL;
    }
    memcpy(p->first, first, (n_kernels + 1) * sizeof *first);
    for (int j = 0; j < n; j++) {
        p->slot[j] = slot[j], p->value[j] = value[j];
        p->argp[j] = blob[j] ? (void *)(uintptr_t)blob[j] : (void *)&p->value[j];
    }
    for (int k = 0; k < n_kernels; k++) {
        NodeParams *kp = &p->kernel[k];
        kp->func = (CUfunction)(uintptr_t)functions[k];
        kp->grid[0] = dims[3 * k], kp->grid[1] = kp->grid[2] = 1;
        kp->block[0] = dims[3 * k + 1], kp->block[1] = kp->block[2] = 1;
        kp->smem = dims[3 * k + 2];
        kp->params = p->argp + first[k];
    }
    return p;
}

/* Write the call's pointers into the parameters; with `changed`, mark the kernels that read a
   slot whose pointer differs from what the graph holds. */
static void bind(Plan *p, const uint64_t *ptrs, char *changed) {
    for (int k = 0; k < p->n_kernels; k++)
        for (int j = p->first[k]; j < p->first[k + 1]; j++) {
            int s = p->slot[j];
            if (s < 0) continue;
            p->value[j] = ptrs[s];
            if (changed && ptrs[s] != p->bound[s]) changed[k] = 1;
        }
}

static CUresult build_graph(Plan *p) {
    CUresult r = cu.graph_create(&p->graph, 0);
    static const EdgeData programmatic = {PORT_PROGRAMMATIC, 0, DEPENDENCY_PROGRAMMATIC, {0}};
    for (int k = 0; !r && k < p->n_kernels; k++) {
        int after = k && !p->programmatic;     /* a full dependency on the kernel before */
        p->failed = k;
        r = cu.graph_add_kernel(&p->node[k], p->graph, after ? &p->node[k - 1] : NULL, after,
                                &p->kernel[k]);
        if (!r && k && p->programmatic)
            r = cu.graph_add_edges(p->graph, &p->node[k - 1], &p->node[k], &programmatic, 1);
    }
    if (!r) p->failed = -1, r = cu.graph_instantiate(&p->exec, p->graph, 0);
    return r;
}

/* Launch kernels first..last-1 with the call's pointers (`ptrs`: the n_slots pointers, inputs
   then outputs): 0 or the CUresult of the failing driver call; st_failed names its kernel. */
int st_launch(void *plan, const uint64_t *ptrs, uint64_t stream, int first, int last) {
    Plan *p = plan;
    CUresult r = cu.ctx_set_current(p->ctx);
    p->failed = -1;
    if (r) return r;
    bind(p, ptrs, NULL);
    for (int k = first; k < last; k++) {
        NodeParams *kp = &p->kernel[k];
        r = cu.launch(kp->func, kp->grid[0], 1, 1, kp->block[0], 1, 1, kp->smem,
                      (CUstream)(uintptr_t)stream, kp->params, NULL);
        if (r) return p->failed = k, r;
    }
    return 0;
}

/* Every kernel as one CUDA graph: built and instantiated on the first such call, its nodes
   updated where the call's pointers differ from the last call's. */
int st_graph(void *plan, const uint64_t *ptrs, uint64_t stream) {
    Plan *p = plan;
    CUresult r = cu.ctx_set_current(p->ctx);
    p->failed = -1;
    if (r || !p->n_kernels) return r;
    if (!p->exec) {
        bind(p, ptrs, NULL);
        if ((r = build_graph(p))) return r;
    } else {
        char changed[p->n_kernels];
        memset(changed, 0, sizeof changed);
        bind(p, ptrs, changed);
        for (int k = 0; k < p->n_kernels; k++)
            if (changed[k] && (r = cu.graph_set_kernel(p->exec, p->node[k], &p->kernel[k])))
                return p->failed = k, r;
    }
    memcpy(p->bound, ptrs, p->n_slots * sizeof *ptrs);
    return cu.graph_launch(p->exec, (CUstream)(uintptr_t)stream);
}

int st_failed(void *plan) { return ((Plan *)plan)->failed; }

int st_has_graph(void *plan) { return ((Plan *)plan)->exec != NULL; }

void st_free(void *plan) {
    Plan *p = plan;
    if (!p) return;
    if (p->exec) cu.exec_destroy(p->exec);
    if (p->graph) cu.graph_destroy(p->graph);
    free(p->kernel), free(p->first), free(p->slot), free(p->value), free(p->argp);
    free(p->bound), free(p->node), free(p);
}
