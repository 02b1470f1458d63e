/* A stand-in for libcuda.so, for tests of runtime/cuda_launcher.c on a machine without a GPU.

   It has the entry points the launcher opens. A kernel launch (plain, or a node of a launched
   graph) calls back into Python (fake_on_launch) with the kernel's argument array, where the
   simulator runs it on CPU memory. As the real driver does, graph nodes copy their argument
   values when added or updated (sizes given per function by fake_params), so a launcher that
   changed a value without updating the node is caught. fake_counts tells what was called. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void *func;
    unsigned grid[3], block[3], smem;
    void **params, **extra;
    void *kern, *ctx;
} NodeParams;

typedef int (*Callback)(void *func, unsigned grid, unsigned block, unsigned smem, void **params,
                        void *stream);

#define MAX_PARAMS 64
#define MAX_FUNCS 16384
typedef struct {
    NodeParams p;
    uint64_t values[MAX_PARAMS * 16];
    void *argv[MAX_PARAMS];
    int joined;                 /* 0: no edge from the node before; 1: a full one; 2: programmatic */
} Node;
typedef struct { int n; Node *nodes[4096]; } Graph;
typedef struct { unsigned char from_port, to_port, type, reserved[5]; } EdgeData;
typedef struct { int n; Node **original; Node *copy; } Exec;

static Callback on_launch;
static long counts[6];          /* launches, graphs instantiated, node updates, graph launches,
                                   contexts set, programmatic edges */
static void *failing;
static struct { void *func; int n; int sizes[MAX_PARAMS]; } funcs[MAX_FUNCS];
static int n_funcs;

void fake_on_launch(Callback cb) { on_launch = cb; }
void fake_fail(void *func) { failing = func; }
void fake_counts(long *out) { memcpy(out, counts, sizeof counts); }

void fake_params(void *func, int n, const int *sizes) {
    funcs[n_funcs].func = func, funcs[n_funcs].n = n;
    memcpy(funcs[n_funcs++].sizes, sizes, n * sizeof *sizes);
}

static int copy_node(Node *dst, const NodeParams *src) {
    int f = 0;
    while (f < n_funcs && funcs[f].func != src->func) f++;
    if (f == n_funcs) return 400;           /* a function the test did not describe */
    dst->p = *src;
    size_t at = 0;
    for (int j = 0; j < funcs[f].n; j++) {
        memcpy((char *)dst->values + at, src->params[j], funcs[f].sizes[j]);
        dst->argv[j] = (char *)dst->values + at;
        at += funcs[f].sizes[j];
    }
    dst->p.params = dst->argv;
    return 0;
}

static int run(const NodeParams *p, void *stream) {
    if (p->func == failing) return 700;     /* CUDA_ERROR_ILLEGAL_ADDRESS */
    if (!on_launch) return 0;                /* timing the host path alone */
    return on_launch(p->func, p->grid[0], p->block[0], p->smem, p->params, stream) ? 719 : 0;
}

int cuCtxSetCurrent(void *ctx) { counts[4]++; return ctx ? 0 : 201; }

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void *stream, void **params, void **extra) {
    NodeParams p = {f, {gx, gy, gz}, {bx, by, bz}, smem, params, extra, 0, 0};
    counts[0]++;
    return run(&p, stream);
}

int cuGraphCreate(Graph **g, unsigned flags) { *g = calloc(1, sizeof **g); return 0; }

int cuGraphAddKernelNode_v2(Node **node, Graph *g, Node *const *deps, size_t n_deps,
                            const NodeParams *p) {
    if (n_deps > 1 || (n_deps && (!g->n || deps[0] != g->nodes[g->n - 1]))) return 1;
    Node *x = calloc(1, sizeof *x);
    if (copy_node(x, p)) return free(x), 400;
    x->joined = n_deps ? 1 : 0;
    g->nodes[g->n++] = *node = x;
    return 0;
}

/* Only the edges the launcher makes: node before -> node, programmatic, from its programmatic
   port (anything else is an error, as a wrong edge would be a race on a GPU). */
int cuGraphAddDependencies_v2(Graph *g, Node *const *from, Node *const *to, const EdgeData *edge,
                              size_t n) {
    if (n != 1 || g->n < 2 || to[0] != g->nodes[g->n - 1] || from[0] != g->nodes[g->n - 2]
        || to[0]->joined || edge->type != 1 || edge->from_port != 1 || edge->to_port) return 1;
    to[0]->joined = 2;
    counts[5]++;
    return 0;
}

int cuGraphInstantiateWithFlags(Exec **e, Graph *g, unsigned long long flags) {
    for (int i = 1; i < g->n; i++)
        if (!g->nodes[i]->joined) return 1;     /* a kernel that could run before the one before */
    Exec *x = calloc(1, sizeof *x);
    x->n = g->n, x->original = malloc(g->n * sizeof *x->original);
    x->copy = malloc(g->n * sizeof *x->copy);
    for (int i = 0; i < g->n; i++) {
        x->original[i] = g->nodes[i], x->copy[i] = *g->nodes[i];
        for (int j = 0; j < MAX_PARAMS; j++)
            if (x->copy[i].argv[j])
                x->copy[i].argv[j] = (char *)x->copy[i].values +
                                     ((char *)g->nodes[i]->argv[j] - (char *)g->nodes[i]->values);
        x->copy[i].p.params = x->copy[i].argv;
    }
    counts[1]++;
    *e = x;
    return 0;
}

int cuGraphExecKernelNodeSetParams_v2(Exec *e, Node *node, const NodeParams *p) {
    for (int i = 0; i < e->n; i++)
        if (e->original[i] == node) {
            counts[2]++;
            return copy_node(&e->copy[i], p);
        }
    return 400;                              /* CUDA_ERROR_INVALID_HANDLE */
}

int cuGraphLaunch(Exec *e, void *stream) {
    counts[3]++;
    for (int i = 0; i < e->n; i++) {
        int r = run(&e->copy[i].p, stream);
        if (r) return r;
    }
    return 0;
}

int cuGraphDestroy(Graph *g) {
    for (int i = 0; i < g->n; i++) free(g->nodes[i]);
    free(g);
    return 0;
}

int cuGraphExecDestroy(Exec *e) { free(e->original), free(e->copy), free(e); return 0; }
