/* libprobe_a.so: defines probe() and asks dlsym(RTLD_NEXT) for the next one. */
#include <dlfcn.h>
#include <stddef.h>

__attribute__((visibility("default"))) int probe(void)
{
    return 1;
}

__attribute__((visibility("default"))) int next_probe(void)
{
    int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe");
    return f != NULL ? f() : -1;
}
