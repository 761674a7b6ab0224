# pragma version 0.4.3
# Stands in for Monad's staking precompile (0x...1000) on the devnet: the same events, with
# the exact signatures of IMonadStaking, over native MON. Placed with anvil_setCode, so it
# keeps no constructor state; epochs advance explicitly (advanceEpoch).

event ValidatorCreated:
    validatorId: indexed(uint64)
    authAddress: indexed(address)
    commission: uint256

event Delegate:
    validatorId: indexed(uint64)
    delegator: indexed(address)
    amount: uint256
    activationEpoch: uint64

event Undelegate:
    validatorId: indexed(uint64)
    delegator: indexed(address)
    withdrawId: uint8
    amount: uint256
    activationEpoch: uint64

event Withdraw:
    validatorId: indexed(uint64)
    delegator: indexed(address)
    withdrawId: uint8
    amount: uint256
    epoch: uint64

event ClaimRewards:
    validatorId: indexed(uint64)
    delegator: indexed(address)
    amount: uint256
    epoch: uint64

event ValidatorRewarded:
    validatorId: indexed(uint64)
    sender: indexed(address)
    amount: uint256
    epoch: uint64

event EpochChanged:
    oldEpoch: uint64
    newEpoch: uint64

epoch: public(uint64)
validatorCount: public(uint64)
validatorAuth: public(HashMap[uint64, address])
validatorStake: public(HashMap[uint64, uint256])
delegation: public(HashMap[uint64, HashMap[address, uint256]])
pendingWithdrawal: public(HashMap[uint64, HashMap[address, HashMap[uint8, uint256]]])
totalStake: public(uint256)


@external
def createValidator(authAddress: address, commission: uint256) -> uint64:
    validator_id: uint64 = self.validatorCount + 1
    self.validatorCount = validator_id
    self.validatorAuth[validator_id] = authAddress
    log ValidatorCreated(validatorId=validator_id, authAddress=authAddress, commission=commission)
    return validator_id


@external
@payable
def delegate(validatorId: uint64):
    assert self.validatorAuth[validatorId] != empty(address), "unknown validator"
    self.delegation[validatorId][msg.sender] += msg.value
    self.validatorStake[validatorId] += msg.value
    self.totalStake += msg.value
    log Delegate(validatorId=validatorId, delegator=msg.sender, amount=msg.value, activationEpoch=self.epoch + 1)


@external
def undelegate(validatorId: uint64, amount: uint256, withdrawId: uint8):
    self.delegation[validatorId][msg.sender] -= amount
    self.validatorStake[validatorId] -= amount
    self.totalStake -= amount
    self.pendingWithdrawal[validatorId][msg.sender][withdrawId] += amount
    log Undelegate(validatorId=validatorId, delegator=msg.sender, withdrawId=withdrawId, amount=amount, activationEpoch=self.epoch + 1)


@external
def withdraw(validatorId: uint64, withdrawId: uint8):
    amount: uint256 = self.pendingWithdrawal[validatorId][msg.sender][withdrawId]
    assert amount > 0, "nothing to withdraw"
    self.pendingWithdrawal[validatorId][msg.sender][withdrawId] = 0
    send(msg.sender, amount)
    log Withdraw(validatorId=validatorId, delegator=msg.sender, withdrawId=withdrawId, amount=amount, epoch=self.epoch)


@external
@payable
def rewardValidator(validatorId: uint64):
    log ValidatorRewarded(validatorId=validatorId, sender=msg.sender, amount=msg.value, epoch=self.epoch)


@external
def advanceEpoch():
    old: uint64 = self.epoch
    self.epoch = old + 1
    log EpochChanged(oldEpoch=old, newEpoch=old + 1)
