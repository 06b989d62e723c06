#include <cstdio>
int main() { std::puts("dlrec"); return 0; }
