/*
 * The host build of the dispatcher core: the definitions of buffet_core_impl.h with
 * external linkage (linked into buffet-nicfw for `buffet trace --engine c`, and into
 * the host unit tests). Freestanding: compiles with -ffreestanding and no libc.
 */
#include "buffet_core_impl.h"
