#include <stdio.h>
int main(void) { puts("cutpointd " CUTPOINT_VERSION); return 0; }
