// A shared object that is not an fp4q CUDA module: it lacks the fp4q_cuda_* C ABI.
extern "C" int fp4q_not_the_abi(void) { return 0; }
