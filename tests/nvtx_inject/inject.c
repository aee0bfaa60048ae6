/*
 * A small NVTX injection library for tests: it records every NVTX range push/pop to a
 * log file, so a test can assert which ranges a program really opened, in what order,
 * and that they balance.
 *
 * NVTX, at the first NVTX call in a process, reads NVTX_INJECTION64_PATH, dlopens that
 * library and calls its InitializeInjectionNvtx2(getExportTable). We ask for the
 * callback table and replace the entries we care about:
 *   CORE  RangePushA / RangePushEx / RangePop        (torch.cuda.nvtx, nvtxRangePush*)
 *   CORE2 DomainCreateA / DomainRegisterStringA
 *         DomainRangePushEx / DomainRangePop         (the `nvtx` Python package)
 *
 * Log format (IC_NVTX_LOG names the file), one event per line, tab separated:
 *   push <tid> <depth> <domain> <message>
 *   pop  <tid> <depth> <domain>
 * <domain> is "-" for the global (CORE) domain. <depth> is the thread's depth after a push,
 * before a pop.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nvtx3/nvToolsExt.h"

static FILE *g_log = NULL;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int t_depth = 0;

/* Domain and registered-string handles are pointers to our own copies of the names. */
static const char *domain_name(nvtxDomainHandle_t d) { return d ? (const char *)d : "-"; }

static const char *message_of(const nvtxEventAttributes_t *a) {
    if (!a) return "";
    switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII: return a->message.ascii ? a->message.ascii : "";
    case NVTX_MESSAGE_TYPE_REGISTERED:
        return a->message.registered ? (const char *)a->message.registered : "";
    case NVTX_MESSAGE_TYPE_UNICODE: return "<unicode>";
    default: return "";
    }
}

static void emit_push(const char *domain, const char *msg) {
    int depth = ++t_depth;
    pthread_mutex_lock(&g_lock);
    if (g_log) {
        fprintf(g_log, "push\t%ld\t%d\t%s\t%s\n", (long)syscall(SYS_gettid), depth, domain, msg);
        fflush(g_log);
    }
    pthread_mutex_unlock(&g_lock);
}

static int emit_pop(const char *domain) {
    int depth = t_depth;
    pthread_mutex_lock(&g_lock);
    if (g_log) {
        fprintf(g_log, "pop\t%ld\t%d\t%s\n", (long)syscall(SYS_gettid), depth, domain);
        fflush(g_log);
    }
    pthread_mutex_unlock(&g_lock);
    if (t_depth > 0) --t_depth;
    return depth;
}

static int NVTX_API my_RangePushA(const char *msg) { emit_push("-", msg ? msg : ""); return t_depth - 1; }
static int NVTX_API my_RangePushEx(const nvtxEventAttributes_t *a) { emit_push("-", message_of(a)); return t_depth - 1; }
static int NVTX_API my_RangePop(void) { return emit_pop("-") - 1; }

static nvtxDomainHandle_t NVTX_API my_DomainCreateA(const char *name) {
    return (nvtxDomainHandle_t)strdup(name ? name : "");
}
static void NVTX_API my_DomainDestroy(nvtxDomainHandle_t d) { (void)d; /* names stay valid */ }
static nvtxStringHandle_t NVTX_API my_DomainRegisterStringA(nvtxDomainHandle_t d, const char *s) {
    (void)d;
    return (nvtxStringHandle_t)strdup(s ? s : "");
}
static int NVTX_API my_DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    emit_push(domain_name(d), message_of(a));
    return t_depth - 1;
}
static int NVTX_API my_DomainRangePop(nvtxDomainHandle_t d) { return emit_pop(domain_name(d)) - 1; }

static int patch(NvtxGetExportTableFunc_t get, NvtxCallbackModule module, unsigned int id,
                 NvtxFunctionPointer fn) {
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = 0;
    unsigned int size = 0;
    if (!cb || !cb->GetModuleFunctionTable(module, &table, &size) || !table || id >= size) return 0;
    *table[id] = fn;
    return 1;
}

int NVTX_API InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
    const char *path = getenv("IC_NVTX_LOG");
    g_log = fopen(path ? path : "nvtx_log.tsv", "w");
    if (!g_log) return 0;
    int ok = 1;
    ok &= patch(get, NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePushA, (NvtxFunctionPointer)my_RangePushA);
    ok &= patch(get, NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePushEx, (NvtxFunctionPointer)my_RangePushEx);
    ok &= patch(get, NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePop, (NvtxFunctionPointer)my_RangePop);
    ok &= patch(get, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainCreateA, (NvtxFunctionPointer)my_DomainCreateA);
    ok &= patch(get, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainDestroy, (NvtxFunctionPointer)my_DomainDestroy);
    ok &= patch(get, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRegisterStringA, (NvtxFunctionPointer)my_DomainRegisterStringA);
    ok &= patch(get, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRangePushEx, (NvtxFunctionPointer)my_DomainRangePushEx);
    ok &= patch(get, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRangePop, (NvtxFunctionPointer)my_DomainRangePop);
    fprintf(g_log, "init\t%d\n", ok);
    fflush(g_log);
    return ok;
}
