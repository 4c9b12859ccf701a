/* libprobe_b.so: the probe() that comes after libprobe_a.so in the search order. */
__attribute__((visibility("default"))) int probe(void)
{
    return 2;
}
