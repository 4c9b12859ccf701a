/*
 * The host half of NCCL's device API (nccl_device.h, NCCL >= 2.28):
 * device communicators, barriers and LL all-to-all resources for kernels
 * that talk to peers themselves.  dshim has no device-side transport, so
 * these are refused with ncclInvalidUsage; they are exported so that a
 * framework importing them (PyTorch 2.11 imports ncclDevCommCreate/Destroy)
 * never reaches the real libnccl with a dshim communicator.
 *
 * nccl_device.h is C++ only, so the prototypes are written here from its
 * declarations: every argument is a pointer, an int or a small struct passed
 * by value, which a function that ignores its arguments may leave unread.
 */
#include "nccl/nccl_internal.h"

static ncclResult_t device_api(const char *call)
{
    return dshim_nccl_fail(ncclInvalidUsage, call,
                           "NCCL's device API (nccl_device.h) is not supported by dshim: kernels cannot reach "
                           "dshim's peers; use the collective calls (PyTorch: leave NCCL symmetric memory off)");
}

/* ncclResult_t ncclDevCommCreate(ncclComm_t, ncclDevCommRequirements_t const*, ncclDevComm_t* outDevComm) */
DSHIM_NCCL_EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm);
DSHIM_NCCL_EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm)
{
    (void)comm, (void)reqs, (void)outDevComm;
    return device_api("ncclDevCommCreate");
}
DSHIM_NCCL_ALIAS(ncclDevCommCreate);

/* ncclResult_t ncclDevCommDestroy(ncclComm_t, ncclDevComm_t const* devComm) */
DSHIM_NCCL_EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void *devComm);
DSHIM_NCCL_EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void *devComm)
{
    (void)comm, (void)devComm;
    return device_api("ncclDevCommDestroy");
}
DSHIM_NCCL_ALIAS(ncclDevCommDestroy);

/* ncclTeam_t is three ints {nRanks, rank, stride}, passed and returned by
 * value: declared here with the same layout. */
typedef struct dshim_nccl_team {
    int nRanks, rank, stride;
} dshim_nccl_team_t;

/* Teams answer without the device API: the world is the communicator, and
 * as no rank reaches another by load/store (dshim has no NVLink domain) the
 * LSA team is the rank alone and the rail team is the world again. */
static dshim_nccl_team_t team_of(ncclComm_t comm, int lsa, const char *call)
{
    if (!dshim_nccl_comm_valid(comm)) {
        dshim_nccl_fail(ncclInvalidArgument, call, "comm %p is not a live dshim communicator", (void *)comm);
        return (dshim_nccl_team_t){0, 0, 1};
    }
    return lsa ? (dshim_nccl_team_t){1, 0, 1} : (dshim_nccl_team_t){comm->nranks, comm->rank, 1};
}

/* ncclTeam_t ncclTeamWorld(ncclComm_t) */
DSHIM_NCCL_EXPORT dshim_nccl_team_t ncclTeamWorld(ncclComm_t comm);
DSHIM_NCCL_EXPORT dshim_nccl_team_t ncclTeamWorld(ncclComm_t comm)
{
    return team_of(comm, 0, "ncclTeamWorld");
}
DSHIM_NCCL_ALIAS(ncclTeamWorld);

/* ncclTeam_t ncclTeamLsa(ncclComm_t) */
DSHIM_NCCL_EXPORT dshim_nccl_team_t ncclTeamLsa(ncclComm_t comm);
DSHIM_NCCL_EXPORT dshim_nccl_team_t ncclTeamLsa(ncclComm_t comm)
{
    return team_of(comm, 1, "ncclTeamLsa");
}
DSHIM_NCCL_ALIAS(ncclTeamLsa);

/* ncclTeam_t ncclTeamRail(ncclComm_t) */
DSHIM_NCCL_EXPORT dshim_nccl_team_t ncclTeamRail(ncclComm_t comm);
DSHIM_NCCL_EXPORT dshim_nccl_team_t ncclTeamRail(ncclComm_t comm)
{
    return team_of(comm, 0, "ncclTeamRail");
}
DSHIM_NCCL_ALIAS(ncclTeamRail);

/* int ncclTeamRankToWorld(ncclComm_t, ncclTeam_t, int rank) */
DSHIM_NCCL_EXPORT int ncclTeamRankToWorld(ncclComm_t comm, dshim_nccl_team_t team, int rank);
DSHIM_NCCL_EXPORT int ncclTeamRankToWorld(ncclComm_t comm, dshim_nccl_team_t team, int rank)
{
    if (!dshim_nccl_comm_valid(comm)) {
        return -1;
    }
    return comm->rank + (rank - team.rank) * team.stride;
}
DSHIM_NCCL_ALIAS(ncclTeamRankToWorld);

/* int ncclTeamRankToLsa(ncclComm_t, ncclTeam_t, int rank): the LSA team is
 * this rank alone, whose LSA rank is 0 */
DSHIM_NCCL_EXPORT int ncclTeamRankToLsa(ncclComm_t comm, dshim_nccl_team_t team, int rank);
DSHIM_NCCL_EXPORT int ncclTeamRankToLsa(ncclComm_t comm, dshim_nccl_team_t team, int rank)
{
    if (!dshim_nccl_comm_valid(comm)) {
        return -1;
    }
    return (rank - team.rank) * team.stride;
}
DSHIM_NCCL_ALIAS(ncclTeamRankToLsa);

/* ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t, ncclTeam_t, int nBarriers,
 *     ncclGinBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq) */
DSHIM_NCCL_EXPORT ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, dshim_nccl_team_t team,
                                                               int nBarriers, void *outHandle, void *outReq);
DSHIM_NCCL_EXPORT ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, dshim_nccl_team_t team,
                                                               int nBarriers, void *outHandle, void *outReq)
{
    (void)comm, (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
    return device_api("ncclGinBarrierCreateRequirement");
}
DSHIM_NCCL_ALIAS(ncclGinBarrierCreateRequirement);

/* ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t, int nBarriers,
 *     ncclLsaBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq) */
DSHIM_NCCL_EXPORT ncclResult_t ncclLsaBarrierCreateRequirement(dshim_nccl_team_t team, int nBarriers,
                                                               void *outHandle, void *outReq);
DSHIM_NCCL_EXPORT ncclResult_t ncclLsaBarrierCreateRequirement(dshim_nccl_team_t team, int nBarriers,
                                                               void *outHandle, void *outReq)
{
    (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
    return device_api("ncclLsaBarrierCreateRequirement");
}
DSHIM_NCCL_ALIAS(ncclLsaBarrierCreateRequirement);

/* int ncclLLA2ACalcSlots(int maxElts, int maxEltSize): a size computation
 * for ncclLLA2ACreateRequirement, which is refused: 0 slots */
DSHIM_NCCL_EXPORT int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
DSHIM_NCCL_EXPORT int ncclLLA2ACalcSlots(int maxElts, int maxEltSize)
{
    (void)maxElts, (void)maxEltSize;
    return 0;
}
DSHIM_NCCL_ALIAS(ncclLLA2ACalcSlots);

/* ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots,
 *     ncclLLA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq) */
DSHIM_NCCL_EXPORT ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, void *outHandle, void *outReq);
DSHIM_NCCL_EXPORT ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, void *outHandle, void *outReq)
{
    (void)nBlocks, (void)nSlots, (void)outHandle, (void)outReq;
    return device_api("ncclLLA2ACreateRequirement");
}
DSHIM_NCCL_ALIAS(ncclLLA2ACreateRequirement);
