/*
 * raid56.h — RAID5/RAID6 parity and reconstruction over one stripe row.
 *
 * A row is ndata data blocks D0..Dn-1 followed by P (and Q for RAID6), all of
 * the same length. P = D0 ^ D1 ^ ... ; Q = sum(g^i * Di) over GF(2^8) with
 * generator g = 2 and polynomial 0x11d (the Linux raid6 convention btrfs uses).
 */
#ifndef BUTTER_VOLUMES_RAID56_H
#define BUTTER_VOLUMES_RAID56_H

#include <stddef.h>

/* Compute P (and Q if nparity == 2) into blocks[ndata], blocks[ndata+1]. */
int raid56_gen_parity(int ndata, int nparity, unsigned char **blocks, size_t len);

/*
 * Rebuild the blocks at indexes @fail_a and @fail_b (-1 if only one failed)
 * of a row of ndata + nparity blocks, in place, from the others. Indexes
 * 0..ndata-1 are data, ndata is P, ndata+1 is Q. Returns 0, or -EINVAL if
 * more blocks failed than nparity can rebuild.
 */
int raid56_recover(int ndata, int nparity, unsigned char **blocks, size_t len, int fail_a,
		   int fail_b);

#endif
