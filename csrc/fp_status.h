/* Status codes shared by every csrc function: FP_OK or a negative FP_* code.
 * Includes nothing, so any header (and the C tests) can use it alone. */
#ifndef FP_STATUS_H
#define FP_STATUS_H

#define FP_OK 0
#define FP_TIMEOUT (-1) /* a bounded wait ran out */
#define FP_AGAIN (-2)   /* ring empty (pop) or full (push): try later */
#define FP_TOOBIG (-3)  /* record larger than the ring can ever hold */
#define FP_CORRUPT (-4) /* magic, version or a record header is wrong */
#define FP_ERRNO (-5)   /* a system call failed; errno says why */
#define FP_INTR (-6)    /* a wait was interrupted by a signal */

#endif /* FP_STATUS_H */
