/* With libdshim.so preloaded (it exports dlsym), dlsym keeps glibc's meaning:
 * RTLD_NEXT is relative to the calling library (libprobe_a.so finds
 * libprobe_b.so's probe, not its own), a handle lookup finds the handle's
 * symbol, and a MXKVStore* name in a library that is not MXNet is left alone. */
#include <dlfcn.h>
#include <stdio.h>

int next_probe(void);

int main(int argc, char **argv)
{
    int failed = 0;
    int v = next_probe();
    if (v != 2) {
        printf("dlsym(RTLD_NEXT) from libprobe_a.so gave probe() = %d, expected 2 (libprobe_b.so)\n", v);
        failed++;
    }
    void *h = dlopen(argc > 1 ? argv[1] : "libprobe_b.so", RTLD_NOW | RTLD_LOCAL);
    int (*p)(void) = h ? (int (*)(void))dlsym(h, "probe") : NULL;
    if (p == NULL || p() != 2) {
        printf("dlsym(handle, \"probe\") failed\n");
        failed++;
    }
    if (h != NULL && dlsym(h, "MXKVStoreCreate") != NULL) {
        printf("dlsym(handle, \"MXKVStoreCreate\") in a library without it returned non-NULL\n");
        failed++;
    }
    printf("%d passed, %d failed\n", 3 - failed, failed);
    return failed != 0;
}
